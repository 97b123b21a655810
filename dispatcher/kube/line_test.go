package kube

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
)

// The index keeps out of the waiting line's read only the tasks that can
// never wait: with a Job, finished, cancelled, being deleted.
func TestMayWait(t *testing.T) {
	t.Parallel()
	now := metav1.Now()
	for _, c := range []struct {
		name string
		edit func(*v1alpha1.RunnerTask)
		want []string
	}{
		{"new", func(*v1alpha1.RunnerTask) {}, []string{"true"}},
		{"waiting for capacity", func(rt *v1alpha1.RunnerTask) {
			rt.Status.Phase, rt.Status.Reason = v1alpha1.PhasePending, ReasonCapacity
		}, []string{"true"}},
		{"its Job made", func(rt *v1alpha1.RunnerTask) {
			rt.Status.Phase, rt.Status.JobName = v1alpha1.PhaseRunning, "rw-a"
		}, nil},
		{"failed before a Job", func(rt *v1alpha1.RunnerTask) { rt.Status.Phase = v1alpha1.PhaseFailed }, nil},
		{"cancelled", func(rt *v1alpha1.RunnerTask) { rt.Spec.Cancel = true }, nil},
		{"being deleted", func(rt *v1alpha1.RunnerTask) { rt.DeletionTimestamp = &now }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			c.edit(rt)
			if diff := cmp.Diff(c.want, mayWait(rt)); diff != "" {
				t.Errorf("mayWait (-want +got):\n%s", diff)
			}
		})
	}
}

// The line read through the index is the line read from every task: the
// same tasks in the same order, with the tasks being started or marked
// left out either way.
func TestLineThroughTheIndexIsTheWholeLine(t *testing.T) {
	t.Parallel()
	var objs []client.Object
	for i, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		rt := runnerTask(name, "uid-"+name)
		// Created in reverse, so the order is the creation order, not the
		// names'.
		rt.CreationTimestamp = metav1.NewTime(time.Unix(int64(100-i), 0))
		switch name {
		case "b":
			rt.Status.Phase, rt.Status.JobName = v1alpha1.PhaseRunning, job.Name(TaskID(rt))
		case "c":
			rt.Status.Phase = v1alpha1.PhaseSucceeded
		case "d":
			rt.Spec.Cancel = true
		case "e":
			rt.Spec.PriorityClass = "high"
		}
		objs = append(objs, rt)
	}
	lines := map[bool][]string{}
	for _, indexed := range []bool{false, true} {
		b := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(objs...)
		if indexed {
			b = b.WithIndex(&v1alpha1.RunnerTask{}, waitingField, mayWait)
		}
		// Two slots for five waiting tasks: the order matters.
		r := New(Options{Client: b.Build(), Jobs: job.Options{DispatcherID: "d1", Queueing: job.Queueing{
			Priorities: map[string]int32{"high": 10},
		}}, Options: runner.Options{MaxConcurrent: 2}})
		r.indexed = indexed
		f := objs[5].(*v1alpha1.RunnerTask)
		r.reserved[key(job.Name(TaskID(f)))] = key("f") // being started
		g := objs[6].(*v1alpha1.RunnerTask)
		r.marked[key("g")] = job.Name(TaskID(g)) // its Running status written, not in the cache yet
		r.starting.Lock()
		line, err := r.line(t.Context(), "runners")
		r.starting.Unlock()
		if err != nil {
			t.Fatalf("indexed %v: %v", indexed, err)
		}
		for _, rt := range line {
			lines[indexed] = append(lines[indexed], rt.Name)
		}
	}
	if diff := cmp.Diff([]string{"e", "h", "a"}, lines[false]); diff != "" {
		t.Fatalf("the line read from every task (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(lines[false], lines[true]); diff != "" {
		t.Errorf("the line through the index differs from the whole line (-whole +indexed):\n%s", diff)
	}
}

// The count of tasks that may wait follows the cache's events: a task
// counts while it may wait, in its namespace, and the count is not used
// before it has seen the cache's first list.
func TestWaitingCountFollowsTheCache(t *testing.T) {
	t.Parallel()
	w := newWaitingCount()
	h := w.handler()
	a, b, other := runnerTask("a", "uid-a"), runnerTask("b", "uid-b"), runnerTask("c", "uid-c")
	other.Namespace = "elsewhere"
	started := b.DeepCopy()
	started.Status.Phase, started.Status.JobName = v1alpha1.PhaseRunning, "rw-b"
	synced := false
	w.synced = func() bool { return synced }
	h.OnAdd(a, true)
	h.OnAdd(b, true)
	h.OnAdd(other, true)
	if _, ok := w.atMost("runners", slices.Values([]types.NamespacedName(nil))); ok {
		t.Fatal("the count was used before it had seen the cache's first list")
	}
	synced = true
	counts := func() map[string]int {
		got := map[string]int{}
		for _, ns := range []string{"runners", "elsewhere"} {
			n, ok := w.atMost(ns, slices.Values([]types.NamespacedName(nil)))
			if !ok {
				t.Fatalf("namespace %s: count not used once synced", ns)
			}
			got[ns] = n
		}
		return got
	}
	// Tasks being started are left out once each, and only where they
	// still count as waiting.
	if n, _ := w.atMost("runners", slices.Values([]types.NamespacedName{key("a"), key("a"), key("gone")})); n != 1 {
		t.Fatalf("2 tasks that may wait, a being started (twice) and a task not counted: %d, want 1", n)
	}
	for _, step := range []struct {
		name  string
		event func()
		want  map[string]int
	}{
		{"listed", func() {}, map[string]int{"runners": 2, "elsewhere": 1}},
		{"b started", func() { h.OnUpdate(b, started) }, map[string]int{"runners": 1, "elsewhere": 1}},
		{"b updated again", func() { h.OnUpdate(started, started) }, map[string]int{"runners": 1, "elsewhere": 1}},
		{"a deleted, last state unknown", func() {
			h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "runners/a", Obj: a})
		}, map[string]int{"runners": 0, "elsewhere": 1}},
		{"b deleted", func() { h.OnDelete(started) }, map[string]int{"runners": 0, "elsewhere": 1}},
		{"c deleted", func() { h.OnDelete(other) }, map[string]int{"runners": 0, "elsewhere": 0}},
	} {
		step.event()
		if diff := cmp.Diff(step.want, counts()); diff != "" {
			t.Fatalf("after %s (-want +got):\n%s", step.name, diff)
		}
	}
}

// A start reads the waiting line only when the tasks that may wait might
// not all fit in the free slots; then the line decides.
func TestStartReadsTheLineOnlyWhenItMayNotFit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		mayWait   []string
		starting  []string
		wantReads int
		wantOK    bool
	}{
		{"all fit", []string{"a", "b", "c"}, nil, 0, true},
		{"more than the free slots", []string{"a", "b", "c", "d"}, nil, 1, true},
		// b holds a slot and still shows as waiting: counted once.
		{"one being started, counted once", []string{"a", "b", "c"}, []string{"b"}, 0, true},
		{"one being started, more than the free slots", []string{"a", "b", "c", "d"}, []string{"b"}, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			reads := 0
			cl := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(runnerTask("a", "uid-a")).
				WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if _, ok := list.(*v1alpha1.RunnerTaskList); ok {
						reads++
					}
					return c.List(ctx, list, opts...)
				}}).Build()
			r := New(Options{Client: cl, Jobs: job.Options{DispatcherID: "d1"}, Options: runner.Options{MaxConcurrent: 3}})
			r.waitingTasks.synced = func() bool { return true }
			for _, name := range c.mayWait {
				r.waitingTasks.add(runnerTask(name, "uid-"+name), true)
			}
			for _, name := range c.starting {
				r.reserved[key("job-"+name)] = key(name)
			}
			ok, msg, err := r.reserve(t.Context(), key("job-a"), runnerTask("a", "uid-a"))
			if err != nil || ok != c.wantOK {
				t.Fatalf("reserve: ok %v, %q, %v; want ok %v", ok, msg, err, c.wantOK)
			}
			if reads != c.wantReads {
				t.Errorf("the line was read %d times, want %d", reads, c.wantReads)
			}
		})
	}
}

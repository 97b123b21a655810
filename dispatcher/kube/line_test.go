package kube

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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

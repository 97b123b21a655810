package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/contract"
)

func runningJob(name string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "runners", Labels: map[string]string{contract.LabelDispatcher: "d1"},
	}}
}

func finishedJob(name string) *batchv1.Job {
	j := runningJob(name)
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	return j
}

func key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "runners", Name: name}
}

// A restarted dispatcher counts the Jobs already running before it starts
// any: the slots they hold are not handed out again.
func TestCapacityCountsRunningJobsBeforeTheFirstStart(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(runningJob("a"), runningJob("b"), finishedJob("c")).Build()
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, Options: runner.Options{MaxConcurrent: 2}})
	ok, msg, err := r.reserve(t.Context(), key("new"), runnerTask("task-new", "uid-new"))
	if err != nil || ok || msg != "2 of 2 tasks running" {
		t.Fatalf("reserve with 2 of 2 slots held by running Jobs: ok %v, %q, %v; want refused, 2 of 2", ok, msg, err)
	}
}

// A Job being deleted holds its slot until it is gone: a foreground
// deletion (the garbage collector's, when a RunnerTask is deleted so) keeps
// it while its pods stop, and they may run meanwhile.
func TestJobBeingDeletedHoldsItsSlot(t *testing.T) {
	t.Parallel()
	deleting := runningJob("a")
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	deleting.Finalizers = []string{metav1.FinalizerDeleteDependents}
	c := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(deleting).Build()
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, Options: runner.Options{MaxConcurrent: 1}})
	ok, msg, err := r.reserve(t.Context(), key("new"), runnerTask("task-new", "uid-new"))
	if err != nil || ok || msg != "1 of 1 tasks running" {
		t.Fatalf("reserve with the only slot held by a Job being deleted: ok %v, %q, %v; want refused, 1 of 1", ok, msg, err)
	}
	gone := deleting.DeepCopy()
	gone.Finalizers = nil
	if err := c.Update(t.Context(), gone); err != nil {
		t.Fatal(err)
	}
	if err := r.recount(t.Context(), key("a")); err != nil {
		t.Fatal(err)
	}
	if ok, msg, err := r.reserve(t.Context(), key("new"), runnerTask("task-new", "uid-new")); err != nil || !ok {
		t.Fatalf("reserve once the Job is gone: ok %v, %q, %v; want the slot", ok, msg, err)
	}
}

// Reservations beyond the last count are counted too, so parallel starts
// never exceed the limit before the cache shows their Jobs.
func TestCapacityCountsReservations(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(runningJob("a")).Build()
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, Options: runner.Options{MaxConcurrent: 3}})
	for i, name := range []string{"x", "y"} {
		if ok, _, err := r.reserve(t.Context(), key(name), runnerTask("task-"+name, "uid-"+name)); err != nil || !ok {
			t.Fatalf("reserve %d: ok %v, %v", i, ok, err)
		}
	}
	if ok, msg, _ := r.reserve(t.Context(), key("z"), runnerTask("task-z", "uid-z")); ok || msg != "3 of 3 tasks running" {
		t.Fatalf("a fourth start with 1 running and 2 reserved of 3: ok %v, %q", ok, msg)
	}
}

// A task that finished before the cache ever showed its Job (deleted,
// cancelled, stopped) gives its slot back.
func TestFinishedTaskGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithScheme(taskScheme(t)).Build()
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, Options: runner.Options{MaxConcurrent: 1}})
	if ok, _, err := r.reserve(t.Context(), key("a"), runnerTask("task-a", "uid-a")); err != nil || !ok {
		t.Fatalf("first reserve: ok %v, %v", ok, err)
	}
	if ok, _, _ := r.reserve(t.Context(), key("b"), runnerTask("task-b", "uid-b")); ok {
		t.Fatal("a second task started with the only slot reserved")
	}
	if err := r.recount(t.Context(), key("a")); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := r.reserve(t.Context(), key("b"), runnerTask("task-b", "uid-b")); err != nil || !ok {
		t.Fatalf("after the first task finished: ok %v, %v; want the slot back", ok, err)
	}
}

// Without Kueue, waiting tasks take free slots in priority order, then in
// the order they were made (names break ties), whichever is reconciled
// first; a class the dispatcher does not know ranks as no priority.
func TestWaitingTasksStartInPriorityThenCreationOrder(t *testing.T) {
	t.Parallel()
	at := func(name, class string, sec int) *v1alpha1.RunnerTask {
		rt := runnerTask(name, "uid-"+name)
		rt.CreationTimestamp = metav1.NewTime(time.Unix(1_700_000_000+int64(sec), 0))
		rt.Spec.PriorityClass = class
		return rt
	}
	tasks := []*v1alpha1.RunnerTask{
		at("old-low", "low", 0), at("old-none", "", 1), at("new-high", "high", 5), at("mid-none", "", 3), at("mid-none-b", "", 3), at("unknown", "nope", 2),
	}
	want := []string{"new-high", "old-none", "unknown", "mid-none", "mid-none-b", "old-low"}
	objs := []client.Object{runningJob("busy")}
	for _, rt := range tasks {
		objs = append(objs, rt)
	}
	c := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(objs...).Build()
	r := New(Options{Client: c, Options: runner.Options{MaxConcurrent: 2}, Jobs: job.Options{DispatcherID: "d1",
		Queueing: job.Queueing{Priorities: map[string]int32{"high": 100, "low": -10}}}})
	for i, name := range want {
		// Every task not yet started tries, in reverse order: only the
		// first in line gets the one free slot.
		var started []string
		for j := len(want) - 1; j >= i; j-- {
			var rt v1alpha1.RunnerTask
			if err := c.Get(t.Context(), key(want[j]), &rt); err != nil {
				t.Fatal(err)
			}
			ok, msg, err := r.reserve(t.Context(), key("job-"+want[j]), &rt)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				started = append(started, want[j])
			} else if j == len(want)-1 && i < len(want)-1 && !strings.Contains(msg, "waiting tasks go first") && !strings.Contains(msg, "tasks running") {
				t.Errorf("%s waits with %q", want[j], msg)
			}
		}
		if len(started) != 1 || started[0] != name {
			t.Fatalf("round %d: %v started, want %s alone", i, started, name)
		}
		// The started task's Job runs; the slot it took stays taken until
		// it finishes, which it does at once here.
		var rt v1alpha1.RunnerTask
		if err := c.Get(t.Context(), key(name), &rt); err != nil {
			t.Fatal(err)
		}
		rt.Status = v1alpha1.RunnerTaskStatus{Phase: v1alpha1.PhaseSucceeded, JobName: "job-" + name}
		if err := c.Update(t.Context(), &rt); err != nil {
			t.Fatal(err)
		}
		if err := r.recount(t.Context(), key("job-"+name)); err != nil {
			t.Fatal(err)
		}
	}
}

// With Kueue, only admitted Jobs count against MaxConcurrent; Jobs waiting
// in Kueue (suspended) count against MaxQueued instead.
func TestKueueCountsAdmittedAndQueuedApart(t *testing.T) {
	t.Parallel()
	queued := func(name string) *batchv1.Job {
		j := runningJob(name)
		j.Labels[job.LabelQueueName] = "team-a"
		j.Spec.Suspend = ptr.To(true)
		return j
	}
	for _, c := range []struct {
		name                string
		maxConcurrent, maxQ int
		ok                  bool
		msg                 string
	}{
		{"room in both", 2, 3, true, ""},
		{"queue full", 2, 2, false, "2 of 2 tasks queued in Kueue"},
		{"admitted full", 1, 3, false, "1 of 1 tasks admitted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cl := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithObjects(runningJob("admitted"), queued("q1"), queued("q2"), finishedJob("done")).Build()
			r := New(Options{Client: cl, Options: runner.Options{MaxConcurrent: c.maxConcurrent, MaxQueued: c.maxQ},
				Jobs: job.Options{DispatcherID: "d1", Queueing: job.Queueing{Kueue: true, DefaultQueue: "team-a"}}})
			ok, msg, err := r.reserve(t.Context(), key("new"), runnerTask("task-new", "uid-new"))
			if err != nil || ok != c.ok || msg != c.msg {
				t.Fatalf("reserve: ok %v, %q, %v; want %v, %q", ok, msg, err, c.ok, c.msg)
			}
		})
	}
}

func taskScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func runnerTask(name, uid string) *v1alpha1.RunnerTask {
	return &v1alpha1.RunnerTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "runners", UID: types.UID(uid)},
		Spec:       v1alpha1.RunnerTaskSpec{Image: "runner:1"},
	}
}

// A RunnerTask deleted while its Job is new (the Job goes with it, before
// the cache shows it) gives its slot back, as does one deleted and made
// again under the same name: the next task runs instead of waiting for a
// slot nothing holds.
func TestDeletedTaskGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	for _, again := range []bool{false, true} {
		c := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).
			WithObjects(runnerTask("a", "uid-a1"), runnerTask("b", "uid-b")).Build()
		maxConcurrent := 1
		if again {
			maxConcurrent = 2 // the new task a takes one
		}
		r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, Options: runner.Options{MaxConcurrent: maxConcurrent}})
		reconcileTask := func(name string) *v1alpha1.RunnerTask {
			t.Helper()
			if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key(name)}); err != nil {
				t.Fatalf("reconcile %s: %v", name, err)
			}
			rt := &v1alpha1.RunnerTask{}
			if err := c.Get(t.Context(), key(name), rt); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
			return rt
		}
		if rt := reconcileTask("a"); rt.Status.Phase != v1alpha1.PhaseRunning {
			t.Fatalf("task a: phase %q, want Running", rt.Status.Phase)
		}
		// The garbage collector removes the Job with its owner, before the
		// dispatcher's cache (here, the client) shows it.
		if err := c.Delete(t.Context(), runnerTask("a", "uid-a1")); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteAllOf(t.Context(), &batchv1.Job{}, client.InNamespace("runners")); err != nil {
			t.Fatal(err)
		}
		if again {
			if err := c.Create(t.Context(), runnerTask("a", "uid-a2")); err != nil {
				t.Fatal(err)
			}
		}
		if rt := reconcileTask("a"); again && rt.Status.Phase != v1alpha1.PhaseRunning {
			t.Fatalf("task a made again: phase %q, want Running", rt.Status.Phase)
		}
		if rt := reconcileTask("b"); rt.Status.Phase != v1alpha1.PhaseRunning {
			t.Fatalf("made again %v: task b: phase %q reason %q (%s), want Running: the deleted task kept its slot",
				again, rt.Status.Phase, rt.Status.Reason, rt.Status.Message)
		}
	}
}

// labelledCache reads Jobs as the dispatcher's cache does: only those with
// its dispatcher label.
type labelledCache struct {
	client.Client
	id string
}

func (c labelledCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := c.Client.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if j, ok := obj.(*batchv1.Job); ok && j.Labels[contract.LabelDispatcher] != c.id {
		return apierrors.NewNotFound(batchv1.Resource("jobs"), key.Name)
	}
	return nil
}

// runnerJobOf is a running Job as Build makes it for the task: its pods
// are runners, and it names the task.
func runnerJobOf(rt *v1alpha1.RunnerTask) *batchv1.Job {
	j := runningJob(job.Name(TaskID(rt)))
	j.UID = "job-" + rt.UID
	j.Labels[contract.TaskID] = "task-" + string(rt.UID)
	j.Annotations = map[string]string{contract.TaskID: TaskID(rt)}
	j.Spec.Template.Labels = map[string]string{contract.LabelRunner: "true", contract.TaskID: j.Labels[contract.TaskID]}
	return j
}

// runnerPodOf is a pod as the Job controller makes it for j: its
// controller reference and the template's labels (job.IsPodOf).
func runnerPodOf(j *batchv1.Job, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: j.Namespace,
		Labels:          map[string]string{batchv1.JobNameLabel: j.Name, contract.LabelRunner: "true", contract.TaskID: j.Labels[contract.TaskID]},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}},
	}}
}

// A Job of a task's name that is not its runner Job, made under another
// dispatcher ID, is never taken for the task's: the task is refused,
// naming the Job, and the Job is left as it was (neither taken over nor
// stopped).
func TestForeignJobIsNeverTakenForTheTasks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		label  string
		status bool
		plant  func(*batchv1.Job)
	}{
		{"another ID, pods not runners", "d0", true, func(j *batchv1.Job) { j.Spec.Template.Labels = nil }},
		{"another ID, another task's", "d0", true, func(j *batchv1.Job) { j.Annotations[contract.TaskID] = "runners/b/uid-b" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			name := job.Name(TaskID(rt))
			if c.status {
				rt.Status = v1alpha1.RunnerTaskStatus{Phase: v1alpha1.PhaseRunning, JobName: name}
			}
			planted := runnerJobOf(rt)
			planted.Labels[contract.LabelDispatcher] = c.label
			c.plant(planted)
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, planted).Build()
			r := New(Options{Client: labelledCache{Client: api, id: "d1"}, Reader: api, Jobs: job.Options{DispatcherID: "d1"}})
			if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key("a")}); err != nil {
				t.Fatal(err)
			}
			var j batchv1.Job
			if err := api.Get(t.Context(), key(name), &j); err != nil {
				t.Fatalf("the planted Job: %v", err)
			}
			if j.Labels[contract.LabelDispatcher] != c.label {
				t.Fatalf("the planted Job's dispatcher label %q, want %q as planted", j.Labels[contract.LabelDispatcher], c.label)
			}
			got := &v1alpha1.RunnerTask{}
			if err := api.Get(t.Context(), key("a"), got); err != nil {
				t.Fatal(err)
			}
			if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != job.ReasonRefused ||
				!strings.Contains(got.Status.Message, "job "+name+" in namespace runners is not a runner Job of task") {
				t.Fatalf("task %s/%s %q, want Failed/Refused naming the Job", got.Status.Phase, got.Status.Reason, got.Status.Message)
			}
		})
	}
}

// TestRewrittenTaskAnnotationDoesNotEndTheTask: the task's Job, of its name
// and with this dispatcher's label (which only the dispatcher puts on a
// Job), whose task annotation someone who may patch Jobs rewrote or
// removed, is still the task's: the task is not ended Refused while its
// Job runs on unwatched, but followed, and ends with its Job.
func TestRewrittenTaskAnnotationDoesNotEndTheTask(t *testing.T) {
	t.Parallel()
	for name, forge := range map[string]func(*batchv1.Job){
		"another task's": func(j *batchv1.Job) { j.Annotations[contract.TaskID] = "runners/b/uid-b" },
		"none":           func(j *batchv1.Job) { j.Annotations = nil },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			rt.Status = v1alpha1.RunnerTaskStatus{Phase: v1alpha1.PhaseRunning, JobName: job.Name(TaskID(rt))}
			j := runnerJobOf(rt)
			j.Labels[contract.LabelDispatcher] = "d1"
			forge(j)
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, j).Build()
			r := New(Options{Client: labelledCache{Client: api, id: "d1"}, Reader: api, Jobs: job.Options{DispatcherID: "d1"}})
			if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key("a")}); err != nil {
				t.Fatal(err)
			}
			got := &v1alpha1.RunnerTask{}
			if err := api.Get(t.Context(), key("a"), got); err != nil {
				t.Fatal(err)
			}
			if got.Status.Phase != v1alpha1.PhaseRunning {
				t.Fatalf("task %s/%s %q, want still Running with its Job", got.Status.Phase, got.Status.Reason, got.Status.Message)
			}
			if err := api.Get(t.Context(), key(j.Name), &batchv1.Job{}); err != nil {
				t.Fatalf("the task's Job: %v", err)
			}
		})
	}
}

// A running task whose Job was made under another dispatcher ID (this
// dispatcher's changed across a restart) is taken over: the Job gets this
// ID, so the cache shows it, instead of the task waiting for it forever.
func TestRunningTaskOfAnotherDispatcherIDIsTakenOver(t *testing.T) {
	t.Parallel()
	rt := runnerTask("a", "uid-a")
	name := job.Name(TaskID(rt))
	rt.Status = v1alpha1.RunnerTaskStatus{Phase: v1alpha1.PhaseRunning, JobName: name}
	old := runnerJobOf(rt)
	old.Labels[contract.LabelDispatcher] = "d0"
	api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, old).Build()
	r := New(Options{Client: labelledCache{Client: api, id: "d1"}, Reader: api, Jobs: job.Options{DispatcherID: "d1"}})
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key("a")}); err != nil {
		t.Fatal(err)
	}
	var j batchv1.Job
	if err := api.Get(t.Context(), key(name), &j); err != nil {
		t.Fatal(err)
	}
	if j.Labels[contract.LabelDispatcher] != "d1" {
		t.Fatalf("Job's dispatcher label %q, want d1", j.Labels[contract.LabelDispatcher])
	}
	got := &v1alpha1.RunnerTask{}
	if err := api.Get(t.Context(), key("a"), got); err != nil || got.Status.Phase != v1alpha1.PhaseRunning {
		t.Fatalf("task phase %q (%v), want still Running", got.Status.Phase, err)
	}
}

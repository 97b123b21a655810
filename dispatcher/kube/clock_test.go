package kube

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
)

// timings records the durations a Recorder is given.
type timings struct {
	runner.NoRecorder
	mu      sync.Mutex
	started []time.Duration
	ran     map[string]time.Duration
}

func (r *timings) Started(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started = append(r.started, d)
}

func (r *timings) Ran(phase string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ran[phase] = d
}

// The kube source tells time by its clock alone: a task's start and
// completion times in its status, and the waits and run times it records,
// come from the injected clock, so stepping the clock is all a test does.
func TestStatusTimesComeFromTheClock(t *testing.T) {
	t.Parallel()
	made := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(made.Add(10 * time.Second))
	rt := runnerTask("a", "uid-a")
	rt.CreationTimestamp = metav1.NewTime(made)
	c := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}, &batchv1.Job{}).WithObjects(rt).Build()
	rec := &timings{ran: map[string]time.Duration{}}
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, Recorder: rec, Options: runner.Options{Clock: clk}})
	reconcileTask := func() *v1alpha1.RunnerTask {
		t.Helper()
		if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: key("a")}); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		got := &v1alpha1.RunnerTask{}
		if err := c.Get(t.Context(), key("a"), got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	got := reconcileTask()
	if got.Status.Phase != v1alpha1.PhaseRunning || got.Status.StartTime == nil || !got.Status.StartTime.Time.Equal(clk.Now()) {
		t.Fatalf("started: phase %q, startTime %v; want Running at %v", got.Status.Phase, got.Status.StartTime, clk.Now())
	}

	j := &batchv1.Job{}
	if err := c.Get(t.Context(), key(got.Status.JobName), j); err != nil {
		t.Fatal(err)
	}
	if j.UID == "" {
		// The fake client draws no UID; the API server would.
		j.UID = "job-uid-a"
		if err := c.Update(t.Context(), j); err != nil {
			t.Fatal(err)
		}
	}
	// The runner's exit 0 is the success the task reports (job.Observer).
	pod := runnerPodOf(j, j.Name+"-abcde")
	pod.Status = corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
		Name: job.RunnerContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}},
	}}}
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(clk.Now())
	j.Status.StartTime = &now
	j.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue},
	}
	if err := c.Status().Update(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	clk.Step(42 * time.Second)

	got = reconcileTask()
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.CompletionTime == nil || !got.Status.CompletionTime.Time.Equal(clk.Now()) {
		t.Fatalf("finished: phase %q, completionTime %v; want Succeeded at %v", got.Status.Phase, got.Status.CompletionTime, clk.Now())
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if diff := cmp.Diff([]time.Duration{10 * time.Second}, rec.started); diff != "" {
		t.Errorf("recorded waits (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]time.Duration{job.PhaseSucceeded: 42 * time.Second}, rec.ran); diff != "" {
		t.Errorf("recorded run times (-want +got):\n%s", diff)
	}
}

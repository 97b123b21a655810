package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/clocktest"
)

// TestRunner looks at its Job every Poll of its clock (default 1s) and,
// once it has ended, prints the runner's log, deletes the Job and says
// whether it succeeded, with the Job's conditions and warning events if
// not.
func TestTestRunnerWaitsForTheJobByItsClock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		end  batchv1.JobCondition
		// exit is the runner container's exit code in the Job's own pod.
		exit int32
		// warning, if set, is a warning event on the Job.
		warning string
		// want is the error's message, "" for none.
		want string
	}{
		{name: "succeeded", end: batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}},
		// The Job controller says SuccessCriteriaMet before Complete, while
		// its pod's finalizer goes: the runner's exit 0 is the success.
		{name: "success criteria met", end: batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: "CompletionsReached"}},
		{
			name: "completed, but not by its own runner",
			end:  batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Message: "Reached expected number of succeeded pods"},
			exit: 3,
			want: "the test runner failed: Job NAME: RunnerNotSucceeded: the Job reports success, but no pod of its own has its runner container terminated with exit code 0 (the runner exited 3): Reached expected number of succeeded pods; Complete:  Reached expected number of succeeded pods; ",
		},
		{
			name:    "failed",
			end:     batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"},
			exit:    1,
			warning: "pods is forbidden: exceeded quota",
			want:    "the test runner failed: Job NAME: NonZeroExit: Job has reached the specified backoff limit; Failed: BackoffLimitExceeded Job has reached the specified backoff limit; FailedCreate: pods is forbidden: exceeded quota; ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := clocktest.New(epoch)
			cl := newCluster(t)
			var out strings.Builder
			s := run(t, func(ctx context.Context) error {
				return TestRunner(ctx, TestRunnerOptions{
					Options: Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Clock: clk},
					Logs:    logs("hello from the runner\n"), Script: "echo hello from the runner", Out: &out,
				})
			})
			j := cl.nextJob(t)
			if got := j.Spec.Template.Spec.Containers[0].Command; strings.Join(got, " ") != "/bin/sh -c echo hello from the runner" {
				t.Errorf("the runner's command is %q, want the script under /bin/sh -c", got)
			}
			// The whole run's timeout and the next look.
			if err := clk.WaitForWaiters(2, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			end(t, cl, j, tt.end, tt.exit, tt.warning)
			s.running(t, "with the Job ended, before the clock moved")
			clk.Step(testRunnerPoll)
			err := s.result(t)
			want := strings.ReplaceAll(tt.want, "NAME", j.Name)
			switch {
			case want == "" && err != nil:
				t.Errorf("TestRunner: %v, want nil", err)
			case want != "" && (!errors.Is(err, ErrTestRunnerFailed) || err.Error() != want):
				t.Errorf("TestRunner: %v, want %q", err, want)
			}
			if out.String() != "hello from the runner\n" {
				t.Errorf("printed %q, want the runner's log", out.String())
			}
			cl.noJobsLeft(t)
		})
	}
}

// A Job that does not end within Timeout on the clock (default 5m) fails
// the test runner, naming the Job; the Job is deleted all the same.
func TestTestRunnerTimesOutByItsClock(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(epoch)
	cl := newCluster(t)
	s := run(t, func(ctx context.Context) error {
		return TestRunner(ctx, TestRunnerOptions{
			Options: Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Clock: clk},
			Logs:    logs(""), Script: "sleep infinity",
		})
	})
	j := cl.nextJob(t)
	if err := clk.WaitForWaiters(2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Step(testRunnerTimeout - time.Millisecond)
	if err := clk.WaitForWaiters(2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	s.running(t, "just before the timeout")
	clk.Step(time.Millisecond)
	err := s.result(t)
	want := "the test runner failed: Job " + j.Name + " did not end within 5m0s (no conditions or warning events)"
	if !errors.Is(err, ErrTestRunnerFailed) || err.Error() != want {
		t.Fatalf("TestRunner: %v, want %q", err, want)
	}
	cl.noJobsLeft(t)
}

// end ends Job j with condition cond and, if warning is set, a warning
// event, and makes its pod (whose log TestRunner prints) with its runner
// container ended with exit code exit.
func end(t *testing.T, cl *cluster, j *batchv1.Job, cond batchv1.JobCondition, exit int32, warning string) {
	t.Helper()
	ctx := t.Context()
	if err := admit(ctx, cl, j); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := cl.Get(ctx, client.ObjectKey{Namespace: j.Namespace, Name: j.Name + "-abcde"}, &pod); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodSucceeded
	if exit != 0 {
		pod.Status.Phase = corev1.PodFailed
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: job.RunnerContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit}}}}
	if err := cl.Status().Update(ctx, &pod); err != nil {
		t.Fatal(err)
	}
	if warning != "" {
		if err := warn(ctx, cl, j, warning); err != nil {
			t.Fatal(err)
		}
	}
	var now batchv1.Job
	if err := cl.Get(ctx, client.ObjectKeyFromObject(j), &now); err != nil {
		t.Fatal(err)
	}
	now.Status.Conditions = append(now.Status.Conditions, cond)
	if err := cl.Status().Update(ctx, &now); err != nil {
		t.Fatal(err)
	}
}

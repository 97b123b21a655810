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
		// warning, if set, is a warning event on the Job.
		warning string
		// want is the error's message, "" for none.
		want string
	}{
		{name: "succeeded", end: batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}},
		{
			name:    "failed",
			end:     batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"},
			warning: "pods is forbidden: exceeded quota",
			want:    "the test runner failed: Job NAME: Failed: BackoffLimitExceeded Job has reached the specified backoff limit; FailedCreate: pods is forbidden: exceeded quota; ",
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
			end(t, cl, j, tt.end, tt.warning)
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
// event, and makes its pod (whose log TestRunner prints).
func end(t *testing.T, cl *cluster, j *batchv1.Job, cond batchv1.JobCondition, warning string) {
	t.Helper()
	ctx := t.Context()
	if err := admit(ctx, cl, j); err != nil {
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

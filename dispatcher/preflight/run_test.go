package preflight

import (
	"context"
	"errors"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/internal/clocktest"
)

// epoch is where the tests' clocks start.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// webhookDown is the Job controller's warning while the webhook cannot be
// called: not a denial.
const webhookDown = `Error creating: Internal error occurred: failed calling webhook "pods.runwarden.dev": failed to call webhook: ` +
	`Post "https://runwarden-webhook.rw.svc:443/mutate-pods?timeout=10s": dial tcp 10.96.0.10:443: connect: connection refused`

// Run looks for the throwaway Job's pod at once and then every Poll of its
// clock (default 500ms), and returns as soon as the pod is there, the Job
// deleted. It never looks again before the clock moves.
func TestRunLooksForThePodEveryPollOfItsClock(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(epoch)
	cl := newCluster(t)
	// The pod is made between the second look and the third.
	cl.onLook = admitAtLook(3)
	s := run(t, func(ctx context.Context) error {
		return Run(ctx, Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Clock: clk})
	})
	cl.nextJob(t)
	for look := 1; look < 3; look++ {
		// The whole check's timeout, the Job's window and the next look.
		if err := clk.WaitForWaiters(3, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		s.running(t, "before the clock moved")
		if got := cl.lookedAtPods(); got != look {
			t.Fatalf("%d looks for the pod before the clock moved %d polls, want %d", got, look-1, look)
		}
		clk.Step(runPoll)
	}
	if err := s.result(t); err != nil {
		t.Fatalf("Run: %v, want nil once the pod is there", err)
	}
	if got := cl.lookedAtPods(); got != 3 {
		t.Errorf("%d looks for the pod, want 3", got)
	}
	if n := cl.jobsMade(); n != 1 {
		t.Errorf("%d Jobs made, want 1", n)
	}
	cl.noJobsLeft(t)
}

// A webhook that cannot be called yet is waited for: the Job whose pod is
// not made is looked at for tryFor on the clock, then a poll later a new
// Job is tried, whose pod is admitted.
func TestRunTriesANewJobWhileTheWebhookCannotBeCalled(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(epoch)
	cl := newCluster(t)
	first := true
	cl.onJob = func(ctx context.Context, c client.WithWatch, j *batchv1.Job) error {
		if first {
			first = false
			return warn(ctx, c, j, webhookDown)
		}
		return admit(ctx, c, j)
	}
	s := run(t, func(ctx context.Context) error {
		return Run(ctx, Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Clock: clk})
	})
	cl.nextJob(t)
	// The first Job's window: a look at once and at each poll; the last
	// step ends the window.
	polls := int(tryFor / runPoll)
	for range polls {
		step(t, clk, 3, runPoll)
	}
	// Between Jobs: the Run's timeout and the next try.
	if err := clk.WaitForWaiters(2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	s.running(t, "with the first Job's window over")
	if n, looks := cl.jobsMade(), cl.lookedAtPods(); n != 1 || looks != polls {
		t.Fatalf("%d Jobs made and %d looks in the first Job's window, want 1 and %d", n, looks, polls)
	}
	clk.Step(runPoll)
	cl.nextJob(t)
	if err := s.result(t); err != nil {
		t.Fatalf("Run: %v, want nil once a Job's pod is admitted", err)
	}
	if n := cl.jobsMade(); n != 2 {
		t.Errorf("%d Jobs made, want 2: one the webhook could not admit, one it admitted", n)
	}
	if took := clk.Since(epoch); took != tryFor+runPoll {
		t.Errorf("Run took %s on the clock, want %s (tryFor, then a poll)", took, tryFor+runPoll)
	}
	cl.noJobsLeft(t)
}

// A Job the Job controller has said nothing about within tryFor (a loaded
// control plane) is watched on rather than replaced: a new Job would only
// start over behind it, and a run of them never saw a refusal in time.
func TestRunWatchesAJobTheJobControllerHasNotReachedYet(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(epoch)
	cl := newCluster(t)
	polls := int(tryFor / runPoll)
	cl.onLook = admitAtLook(2 * polls)
	s := run(t, func(ctx context.Context) error {
		return Run(ctx, Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Clock: clk})
	})
	cl.nextJob(t)
	for range 2*polls - 1 {
		step(t, clk, 3, runPoll)
	}
	if err := s.result(t); err != nil {
		t.Fatalf("Run: %v, want nil once the pod is there", err)
	}
	if n := cl.jobsMade(); n != 1 {
		t.Errorf("%d Jobs made, want 1: the Job the Job controller had not reached yet, watched on", n)
	}
	cl.noJobsLeft(t)
}

// With no pod within Timeout on the clock, Run fails naming the timeout
// and the last warning the Job controller gave; the Job is deleted.
func TestRunTimesOutByItsClock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		warning string
		want    string
	}{
		{"the webhook down", webhookDown, "preflight failed: no runner pod within 3s in runners (last warning: " + webhookDown + ")"},
		{"no word", "", "preflight failed: no runner pod within 3s in runners (no pod appeared)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := clocktest.New(epoch)
			cl := newCluster(t)
			cl.onJob = func(ctx context.Context, c client.WithWatch, j *batchv1.Job) error {
				if tt.warning == "" {
					return nil
				}
				return warn(ctx, c, j, tt.warning)
			}
			const timeout = 3 * time.Second
			s := run(t, func(ctx context.Context) error {
				return Run(ctx, Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Timeout: timeout, Clock: clk})
			})
			cl.nextJob(t)
			polls := int(timeout / runPoll)
			for range polls - 1 {
				step(t, clk, 3, runPoll)
			}
			if err := clk.WaitForWaiters(3, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			s.running(t, "a poll before the timeout")
			clk.Step(runPoll)
			err := s.result(t)
			if !errors.Is(err, ErrFailed) || err.Error() != tt.want {
				t.Fatalf("Run: %v, want %q", err, tt.want)
			}
			if looks := cl.lookedAtPods(); looks != polls {
				t.Errorf("%d looks for the pod, want %d: at once, then each poll but the one at the timeout", looks, polls)
			}
			cl.noJobsLeft(t)
		})
	}
}

// A pod refused by admission fails Run at once, naming the refusal; the
// clock never has to move.
func TestRunFailsAtOnceOnADenial(t *testing.T) {
	t.Parallel()
	const denied = `Error creating: admission webhook "pods.runwarden.dev" denied the request: privileged containers are not allowed`
	clk := clocktest.New(epoch)
	cl := newCluster(t)
	cl.onJob = func(ctx context.Context, c client.WithWatch, j *batchv1.Job) error { return warn(ctx, c, j, denied) }
	err := Run(t.Context(), Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Clock: clk})
	want := "preflight failed: a runner pod is not admitted in runners (Pod Security, an admission webhook or quota): " + denied
	if !errors.Is(err, ErrFailed) || err.Error() != want {
		t.Fatalf("Run: %v, want %q", err, want)
	}
	if clk.Since(epoch) != 0 {
		t.Errorf("the clock moved")
	}
	cl.noJobsLeft(t)
}

// admitAtLook makes the pod of the one Job there is (admit) at the look
// numbered look, and fails the look when there is not exactly one Job.
func admitAtLook(look int) func(ctx context.Context, c client.WithWatch, n int) error {
	return func(ctx context.Context, c client.WithWatch, n int) error {
		if n < look {
			return nil
		}
		var jobs batchv1.JobList
		if err := c.List(ctx, &jobs); err != nil || len(jobs.Items) != 1 {
			return errors.Join(err, errors.New("want one Job"))
		}
		return admit(ctx, c, &jobs.Items[0])
	}
}

// A refusal is read only from a warning about the throwaway Job itself (its
// kind and UID): whoever may create events in the namespace cannot fail
// every replica's preflight, and so stop the dispatcher, with an event
// about an object of another kind, or another Job, of the same name (the
// writers policy keeps events about Jobs and pods named rw-... to the
// components alone, not those of other kinds).
func TestRunBelievesOnlyTheJobsOwnRefusal(t *testing.T) {
	t.Parallel()
	const denied = `Error creating: admission webhook "pods.runwarden.dev" denied the request: forged`
	clk := clocktest.New(epoch)
	cl := newCluster(t)
	cl.onJob = func(ctx context.Context, c client.WithWatch, j *batchv1.Job) error {
		other := *j
		other.UID = "another-jobs-uid"
		rs := other
		rs.UID = j.UID
		return errors.Join(warn(ctx, c, &other, denied), warnAbout(ctx, c, &rs, "ReplicaSet", denied))
	}
	cl.onLook = admitAtLook(2)
	s := run(t, func(ctx context.Context) error {
		return Run(ctx, Options{Client: cl, Jobs: jobOptions(), Namespace: "runners", Clock: clk})
	})
	cl.nextJob(t)
	if err := clk.WaitForWaiters(3, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	s.running(t, "after the forged refusals")
	clk.Step(runPoll)
	if err := s.result(t); err != nil {
		t.Fatalf("Run: %v, want nil once the pod is there", err)
	}
	cl.noJobsLeft(t)
}

package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
)

// ErrTestRunnerFailed is a test runner that did not succeed.
var ErrTestRunnerFailed = errors.New("the test runner failed")

// TestRunnerOptions configure TestRunner.
type TestRunnerOptions struct {
	// Options are the client, the Job options, the namespace (all three
	// required), the timeout of the whole run (default 5m), how often the
	// Job is looked at (default 1s) and the clock.
	Options
	// Logs reads the runner container's log. Required.
	Logs runner.LogReader
	// Script is the runner container's shell script. Required.
	Script string
	// Out receives the runner container's log.
	Out io.Writer
}

// TestRunner waits this long at most, and looks at its Job this often,
// unless its options say otherwise.
const (
	testRunnerTimeout = 5 * time.Minute
	testRunnerPoll    = time.Second
)

// TestRunner runs one runner Job, made from the platform's template exactly
// as a task's (so the webhook shapes its pod as a runner's), with Script as
// the runner container's command; it waits for the Job to end, writes the
// runner's log to Out, deletes the Job, and returns nil if it succeeded.
// `helm test` runs it: only the dispatcher may make runner Jobs.
func TestRunner(ctx context.Context, o TestRunnerOptions) error {
	o.setDefaults(testRunnerTimeout, testRunnerPoll)
	ctx, cancel := withTimeout(ctx, o.Clock, o.Timeout)
	defer cancel()
	j, _, err := job.Build(job.Task{
		ID: "test-runner-" + suffix(), Namespace: o.Namespace,
		Command: []string{"/bin/sh", "-c", o.Script},
	}, o.Jobs)
	if err != nil {
		return err
	}
	remove, err := o.create(ctx, j)
	if err != nil {
		return fmt.Errorf("creating the test runner Job: %w", err)
	}
	defer remove()
	key := client.ObjectKeyFromObject(j)
	// Its outcome read as a task's (job.Observer): success only from the
	// Job's own runner pod's exit 0, not from the Job's conditions alone.
	obs := job.Observer{Client: o.Client, Events: o.Client, Now: o.Clock.Now}
	var out job.Outcome
	ended, err := poll(ctx, o.Clock, o.Poll, func() (bool, error) {
		if err := o.Client.Get(ctx, key, j); err != nil {
			return false, fmt.Errorf("reading the test runner Job: %w", err)
		}
		if !job.Finished(j) {
			return false, nil
		}
		out, err = obs.Outcome(ctx, j)
		if err != nil {
			return false, fmt.Errorf("reading the test runner Job's outcome: %w", err)
		}
		return out.Phase != "", nil
	})
	if err != nil {
		return err
	}
	if !ended {
		return fmt.Errorf("%w: Job %s did not end within %s (%s)", ErrTestRunnerFailed, j.Name, o.Timeout, warnings(ctx, o.Client, j))
	}
	// The log of the Job's own pod only (job.IsPodOf).
	if pods, err := job.PodsOf(ctx, o.Client, j, false); err == nil {
		for _, p := range pods {
			// The container has ended: following its log reads it whole.
			if rc, err := o.Logs.Follow(ctx, o.Namespace, p.Name, job.RunnerContainer); err == nil {
				if o.Out != nil {
					_, _ = io.Copy(o.Out, rc)
				}
				_ = rc.Close()
			}
		}
	}
	if out.Phase == job.PhaseSucceeded {
		return nil
	}
	return fmt.Errorf("%w: Job %s: %s: %s; %s", ErrTestRunnerFailed, j.Name, out.Reason, out.Message, warnings(ctx, o.Client, j))
}

// warnings are the Job's conditions and Warning events, for a failure
// message.
func warnings(ctx context.Context, c client.Client, j *batchv1.Job) string {
	msg := ""
	for _, cond := range j.Status.Conditions {
		if cond.Status == corev1.ConditionTrue {
			msg += fmt.Sprintf("%s: %s %s; ", cond.Type, cond.Reason, cond.Message)
		}
	}
	for _, e := range (job.Observer{Client: c}).JobWarnings(context.WithoutCancel(ctx), j) {
		msg += e.Reason + ": " + e.Message + "; "
	}
	if msg == "" {
		return "no conditions or warning events"
	}
	return msg
}

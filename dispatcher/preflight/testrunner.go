package preflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
)

// ErrTestRunnerFailed is a test runner that did not succeed.
var ErrTestRunnerFailed = errors.New("the test runner failed")

// TestRunnerOptions configure TestRunner.
type TestRunnerOptions struct {
	// Client creates and reads the Job. It must not be a cache. Required.
	Client client.Client
	// Logs reads the runner container's log. Required.
	Logs runner.LogReader
	// Jobs is how the dispatcher builds Jobs. Required.
	Jobs job.Options
	// Namespace is where runner Jobs run. Required.
	Namespace string
	// Script is the runner container's shell script. Required.
	Script string
	// Out receives the runner container's log.
	Out io.Writer
	// Timeout bounds the whole run. Default: 5m.
	Timeout time.Duration
	// Poll is how often the Job is looked at. Default: 1s.
	Poll time.Duration
}

// TestRunner runs one runner Job, made from the platform's template exactly
// as a task's (so the webhook shapes its pod as a runner's), with Script as
// the runner container's command; it waits for the Job to end, writes the
// runner's log to Out, deletes the Job, and returns nil if it succeeded.
// `helm test` runs it: only the dispatcher may make runner Jobs.
func TestRunner(ctx context.Context, o TestRunnerOptions) error {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var id [4]byte
	_, _ = rand.Read(id[:])
	j, _, err := job.Build(job.Task{
		ID: "test-runner-" + hex.EncodeToString(id[:]), Namespace: o.Namespace,
		Command: []string{"/bin/sh", "-c", o.Script},
	}, o.Jobs)
	if err != nil {
		return err
	}
	j.Annotations[job.AnnotationPreflight] = "true"
	if err := o.Client.Create(ctx, j); err != nil {
		return fmt.Errorf("creating the test runner Job: %w", err)
	}
	defer func() {
		// Not ctx: it may have ended.
		del, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = o.Client.Delete(del, j, client.PropagationPolicy(metav1.DeletePropagationBackground))
	}()
	key := client.ObjectKeyFromObject(j)
	for !job.Finished(j) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: Job %s did not end within %s (%s)", ErrTestRunnerFailed, j.Name, o.Timeout, warnings(ctx, o.Client, j))
		case <-time.After(o.Poll):
		}
		if err := o.Client.Get(ctx, key, j); err != nil {
			return fmt.Errorf("reading the test runner Job: %w", err)
		}
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
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("%w: Job %s: %s", ErrTestRunnerFailed, j.Name, warnings(ctx, o.Client, j))
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
	var events corev1.EventList
	if err := c.List(context.WithoutCancel(ctx), &events, client.InNamespace(j.Namespace)); err == nil {
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && e.InvolvedObject.Name == j.Name {
				msg += e.Reason + ": " + e.Message + "; "
			}
		}
	}
	if msg == "" {
		return "no conditions or warning events"
	}
	return msg
}

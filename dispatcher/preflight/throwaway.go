package preflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// Options configure Run and EnvFiles, and TestRunner (TestRunnerOptions
// embeds them).
type Options struct {
	// Client creates and watches the throwaway Job. It must not be a cache.
	Client client.Client
	// Jobs is how the dispatcher builds Jobs. Required.
	Jobs job.Options
	// Namespace is where runner Jobs run. Required.
	Namespace string
	// Timeout bounds the whole check. Default: 2m for Run, 5m for
	// TestRunner.
	Timeout time.Duration
	// Poll is how often the Job is looked at. Default: 500ms for Run, 1s
	// for TestRunner.
	Poll time.Duration
	// Clock tells when to look again and when the time is up. Default: the
	// real clock.
	Clock clock.WithDelayedExecution
}

// setDefaults fills in the fields left zero; timeout and poll are the
// check's own defaults.
func (o *Options) setDefaults(timeout, poll time.Duration) {
	if o.Timeout <= 0 {
		o.Timeout = timeout
	}
	if o.Poll <= 0 {
		o.Poll = poll
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// deleteTimeout bounds the request that deletes a throwaway Job. It is a
// bound on one API request, as a client's request timeout is, not a wait
// of the check's: it is not on the check's clock, so that all a test
// stepping that clock sees waiting on it are the check's own waits.
const deleteTimeout = 30 * time.Second

// create creates the throwaway Job j, marked as the preflight's (the
// sources leave it alone), and returns what deletes it and its pods: not
// with ctx, which may have ended by then, and within deleteTimeout.
func (o *Options) create(ctx context.Context, j *batchv1.Job) (remove func(), err error) {
	j.Annotations[job.AnnotationPreflight] = "true"
	if err := o.Client.Create(ctx, j); err != nil {
		return nil, err
	}
	return func() {
		del, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
		defer cancel()
		_ = o.Client.Delete(del, j, client.PropagationPolicy(metav1.DeletePropagationBackground))
	}, nil
}

// suffix is a random name part, so that no two throwaway Jobs share a
// name.
func suffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

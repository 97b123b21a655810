package runner

import (
	"context"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// Settler settles the Jobs of finished tasks: once a source holds a task's
// outcome (in a RunnerTask's status, in the orchestrator's answer), the
// Job is marked reported, which gives it its TTL and lets the history
// limits count it, and the oldest reported Jobs of its namespace beyond the
// limits go.
type Settler struct {
	// Client reads (a cache is enough) and writes the Jobs.
	Client client.Client
	// Jobs is how the source builds Jobs: the dispatcher ID, the TTL.
	Jobs job.Options
	// Options are the history limits and the clock.
	Options Options
}

// Settle marks the finished Job j reported, unless it is, to be kept at
// least until keepUntil (zero: no longer than its TTL), then prunes the
// history of its namespace. requeue is how soon to prune again, zero when
// there is no need: a Job beyond the limits that is still to be kept goes
// in a later prune.
func (s Settler) Settle(ctx context.Context, j *batchv1.Job, keepUntil time.Time) (requeue time.Duration, err error) {
	if err := s.Mark(ctx, j, keepUntil); err != nil {
		return 0, err
	}
	return s.Prune(ctx, j)
}

// Mark marks the finished Job j reported, unless it is, to be kept at
// least until keepUntil (zero: no longer than its TTL). A source that
// counts the task's end between the mark and the prune calls Mark, then
// Prune.
func (s Settler) Mark(ctx context.Context, j *batchv1.Job, keepUntil time.Time) error {
	if j.Annotations[job.AnnotationReported] != "" {
		return nil
	}
	return job.MarkReported(ctx, s.Client, j, s.Jobs, keepUntil)
}

// Prune deletes this dispatcher's oldest reported Jobs beyond the history
// limits in j's namespace, counting j as reported (the cache may not show
// its mark yet). A source calls it again once the mark reaches the cache:
// prunes that ran at nearly the same moment each saw only their own mark.
func (s Settler) Prune(ctx context.Context, j *batchv1.Job) (requeue time.Duration, err error) {
	now := s.Options.Clock.Now()
	next, err := job.PruneHistory(ctx, s.Client, job.History{
		Namespace: j.Namespace, DispatcherID: s.Jobs.DispatcherID,
		Succeeded: s.Options.SucceededHistory, Failed: s.Options.FailedHistory, Marked: j.Name, Now: now,
	})
	if err != nil || next.IsZero() {
		return 0, err
	}
	return next.Sub(now), nil
}

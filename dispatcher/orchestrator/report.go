package orchestrator

import (
	"context"
	"net/http"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// report sends an event with the task's idempotency key and current epoch.
func (s *Source) report(ctx context.Context, t *task, e Event) error {
	v, _ := s.leases.view(t)
	e.Epoch = v.epoch
	e.IdempotencyKey = v.id + "/" + string(e.Type)
	if e.Type.Final() {
		e.IdempotencyKey = v.id + "/final"
	}
	if e.Time.IsZero() {
		e.Time = s.clock.Now().UTC()
	}
	err := s.opts.Client.Report(ctx, v.id, e)
	if err != nil {
		s.opts.Recorder.SourceError("report")
	}
	return err
}

// send reports a non-final event once per process; the orchestrator
// de-duplicates across processes by idempotency key.
func (s *Source) send(ctx context.Context, t *task, e Event) error {
	err := s.report(ctx, t, e)
	if err != nil && !IsConflict(err) {
		return err
	}
	s.leases.eventSent(t, e.Type)
	return nil
}

// queued reports a Job waiting in Kueue.
func (s *Source) queued(ctx context.Context, t *task, v lease, j *batchv1.Job, out job.Outcome) (reconcile.Result, error) {
	if !v.sent[EventQueued] {
		err := s.send(ctx, t, Event{Type: EventQueued, JobName: j.Name, Reason: job.ReasonQueued, Message: out.Message})
		if statusOf(err) == http.StatusBadRequest {
			// An orchestrator of protocol 1.0 knows no queued event: it
			// learns of the task again when it runs.
			s.log.Info("the orchestrator refused a queued event (protocol 1.0); not sent again", "task", v.id, "error", err.Error())
			s.leases.eventSent(t, EventQueued)
		} else if err != nil {
			return reconcile.Result{}, err
		}
	}
	// Admission and eviction change the Job, which is watched.
	return reconcile.Result{RequeueAfter: 6 * s.opts.RequeueAfter}, nil
}

// refuse reports a task that can never run as failed, without a Job.
func (s *Source) refuse(ctx context.Context, t *task, cause error) {
	id := t.id
	s.log.Info("task refused", "task", id, "reason", cause.Error())
	e := Event{Type: EventFailed, Reason: job.ReasonRefused, Message: cause.Error()}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := s.report(ctx, t, e)
		if err == nil || IsConflict(err) {
			break
		}
		if !IsRetryable(err) {
			// Sending it again cannot help (say, the orchestrator does not
			// know the task): the lease expires and the task is the
			// orchestrator's again.
			s.log.Error(err, "the orchestrator refused the report of a refused task; letting the task go", "task", id)
			break
		}
		s.wait(ctx, s.opts.Backoff.Delay(attempt, err))
	}
	s.opts.Recorder.Finished(job.PhaseFailed, job.ReasonRefused)
	s.leases.forget(t)
}

// finish stops the Job's pod when the outcome came before the Job's end
// (recording the outcome on the Job first), frees the slot once the Job can
// no longer run, reports the outcome, and marks the Job reported.
func (s *Source) finish(ctx context.Context, t *task, j *batchv1.Job, out job.Outcome) (reconcile.Result, error) {
	if gone, err := s.stop(ctx, j, out); err != nil || gone {
		// A Job gone meanwhile: the reconcile of its deletion reports it.
		return reconcile.Result{}, err
	}
	// The Job can no longer run: its pod ended, or it is suspended with its
	// outcome recorded, or it is gone. Its slot frees.
	s.leases.finished(t)
	if wait := s.logsPending(t); wait {
		return reconcile.Result{RequeueAfter: 500 * time.Millisecond}, nil
	}
	e, err := s.finalEvent(ctx, j, out)
	if err != nil {
		return reconcile.Result{}, err
	}
	err = s.report(ctx, t, e)
	v, _ := s.leases.view(t)
	switch {
	case err == nil:
	case IsConflict(err) && j != nil && s.awaitingReissue(v):
		// The lease is gone and the orchestrator holds a newer one: most
		// often this dispatcher's own, issued in a poll whose answer was
		// lost. The orchestrator hands an expired lease back to the
		// dispatcher that lists the task as running, which this one does
		// until it lets go: letting go now would have the task handed to
		// any dispatcher once that lease expires, and run twice.
		s.log.Info("the outcome was refused as stale while the lease is gone; waiting for the orchestrator to hand it back", "task", v.id)
		return reconcile.Result{RequeueAfter: s.opts.RequeueAfter}, nil
	case IsConflict(err) && (j == nil || v.lost()):
		// A stale lease, and no Job left to report from or the lease gone
		// for longer than a hand-back takes: no final event is stored under
		// the task's key (a stored one is answered as stored, whatever the
		// epoch), so another holder has the task and reports it. The Job is
		// left to that holder, unmarked; it gets its TTL so it does not stay
		// for ever if no holder ever comes back to it. (An orchestrator that
		// refuses a repeated final event with an older epoch as stale ends
		// here too, though the task is over.)
		s.log.Info("the outcome was refused as stale and the lease was not handed back; another holder has the task, and its Job is left unmarked", "task", v.id)
		if j != nil && j.Spec.TTLSecondsAfterFinished == nil {
			if err := job.GiveTTL(ctx, s.opts.Kube, j, s.opts.Jobs); err != nil {
				return reconcile.Result{}, err
			}
		}
		s.leases.forget(t)
		return reconcile.Result{}, nil
	default:
		// A conflict here is a lease handed back with a new epoch that
		// this report raced with, or one held elsewhere: the retry uses the
		// current epoch, and a lease found gone stops the reports.
		return reconcile.Result{}, err
	}
	if j != nil {
		// The Job stays as the record that the task ended until no
		// delivery of its lease can come any more (see keepFor); a stopped
		// one (suspended: it never finishes, so its TTL would not remove it)
		// is deleted then by Reconcile.
		if err := s.settler.Mark(ctx, j, s.clock.Now().Add(s.keepFor(v))); err != nil {
			return reconcile.Result{}, err
		}
	}
	s.opts.Recorder.Finished(out.Phase, out.Reason)
	if !v.runningAt.IsZero() {
		s.opts.Recorder.Ran(out.Phase, s.clock.Now().Sub(v.runningAt))
	}
	s.log.Info("task finished", "task", v.id, "phase", out.Phase, "reason", out.Reason)
	s.leases.forget(t)
	if j == nil {
		return reconcile.Result{}, nil
	}
	return s.pruneHistory(ctx, j)
}

// finalEvent is the final event of outcome out, with the record of the
// Job's run when there is a Job.
func (s *Source) finalEvent(ctx context.Context, j *batchv1.Job, out job.Outcome) (Event, error) {
	e := Event{Type: EventSucceeded, Reason: out.Reason, Message: out.Message, ExitCode: out.ExitCode}
	switch out.Phase {
	case job.PhaseFailed:
		e.Type = EventFailed
	case job.PhaseCancelled:
		e.Type = EventCancelled
	}
	if j == nil {
		return e, nil
	}
	e.JobName = j.Name
	rec, err := job.ReadRecord(ctx, s.opts.Kube, j)
	if err != nil {
		return e, err
	}
	e.Record = wireRecord(rec)
	return e, nil
}

// awaitingReissue tells whether the task's lease is gone recently enough
// that the orchestrator may still hand it back to this dispatcher: within a
// lease (a newer lease issued meanwhile expires) and a poll (the next poll
// lists the task as running), twice over.
func (s *Source) awaitingReissue(v lease) bool {
	wait := 2 * (leaseDuration(v.seconds) + s.opts.PollWait)
	return v.lost() && s.clock.Now().Before(v.lostAt.Add(wait))
}

// keepFor is how long a Job stays once its task's final event is
// acknowledged: the record that the lease ended, for a late delivery of it
// (start checks the Job). A delivery composed before the end carries an
// expiry no later than the end plus the lease's duration, and the poll that
// carries it may be held for a poll wait; take ignores a lease that arrives
// more than a poll wait past its expiry. Neither leader of several replicas
// remembers ended leases in memory alone.
func (s *Source) keepFor(v lease) time.Duration {
	return leaseDuration(v.seconds) + s.opts.PollWait
}

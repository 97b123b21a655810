package orchestrator

import (
	"context"
	"sync"
	"time"
)

// maxRenewals is how many lease renewals may be in flight at once.
const maxRenewals = 32

// renewTick is how often the renewal loop looks for leases due.
const renewTick = 250 * time.Millisecond

// renewals are the renewals in flight of one renewal loop.
type renewals struct {
	// sem holds a token per renewal in flight, at most maxRenewals.
	sem chan struct{}
	wg  sync.WaitGroup
	// refused receives the first refusal of this dispatcher (IsFatal).
	refused chan error
}

func newRenewals() *renewals {
	return &renewals{sem: make(chan struct{}, maxRenewals), refused: make(chan error, 1)}
}

// renewLoop renews each lease at a third of its duration and delivers
// cancellations. Only a fatal error (refused credentials, another protocol
// version) ends it: while the source is full it does not poll, and a
// renewal is where a refusal shows.
func (s *Source) renewLoop(ctx context.Context) error {
	r := newRenewals()
	defer r.wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // before the wait: the renewals in flight end
	tick := s.clock.NewTicker(renewTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-r.refused:
			return err
		case <-tick.C():
		}
		s.renewDue(ctx, r)
	}
}

// renewDue starts the renewals due by the source's clock. Renewals run
// side by side, at most maxRenewals at once, and a slow one holds up no
// other: each tick starts those that are due and not in flight.
func (s *Source) renewDue(ctx context.Context, r *renewals) {
	for _, t := range s.leases.due(s.clock.Now()) {
		r.wg.Go(func() {
			defer s.leases.renewed(t)
			select {
			case r.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-r.sem }()
			if err := s.renew(ctx, t); err != nil {
				select {
				case r.refused <- err:
				default: // another renewal's refusal is ahead
				}
			}
		})
	}
}

// renew renews a task's lease. It returns an error only when the
// orchestrator refused this dispatcher, which ends the source.
func (s *Source) renew(ctx context.Context, t *task) error {
	v, _ := s.leases.view(t)
	resp, err := s.opts.Client.Renew(ctx, v.leaseID, v.epoch)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		s.opts.Recorder.RenewFailed()
		s.opts.Recorder.SourceError("renew")
		if IsFatal(err) {
			return refused(err)
		}
		s.renewFailed(t, v.leaseID, err)
		return nil
	}
	s.leases.extended(t, v.leaseID)
	if resp.Cancel && s.leases.cancelled(t, resp.CancelReason) && !v.creating() {
		// The Job's reconcile stops it; a Job being created is stopped
		// once it exists.
		s.enqueue(ctx, v.key)
	}
	return nil
}

// renewFailed takes in a renewal of lease leaseID that failed with err: a
// lease gone waits to be handed back, another failure paces the next try.
func (s *Source) renewFailed(t *task, leaseID string, err error) {
	now := s.clock.Now()
	if IsGone(err) {
		// Expired: the orchestrator hands it back to this dispatcher (the
		// task is in every poll's running list) with a new epoch.
		if v, ok := s.leases.gone(t, leaseID, now); ok {
			s.log.Info("lease gone; waiting for the orchestrator to hand the task back", "task", v.id)
		}
		return
	}
	// Unreachable, overloaded, or this renewal refused: back off per lease
	// as polls and reports do, honouring Retry-After, within the pace the
	// table keeps (leaseTable.renewalFailed).
	backoff := func(failures int) time.Duration { return s.opts.Backoff.Delay(failures, err) }
	if v, d, ok := s.leases.renewalFailed(t, leaseID, now, backoff); ok {
		s.log.V(1).Info("renewing the lease failed; retrying", "task", v.id, "in", d.Round(time.Millisecond).String(), "failures", v.renewFailures, "error", err.Error())
	}
}

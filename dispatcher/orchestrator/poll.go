package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// minPollInterval is the least time between the starts of two polls that
// came back empty.
const minPollInterval = time.Second

// pollLoop long-polls for leases while there is free capacity, backing off
// on errors. Only a fatal error (refused credentials, another protocol
// version) ends it.
func (s *Source) pollLoop(ctx context.Context) error {
	failures := 0
	for ctx.Err() == nil {
		free, inFlight, lost, held := s.leases.capacity(s.opts.MaxConcurrent, s.opts.MaxQueued)
		s.opts.Recorder.Running(inFlight)
		if free == 0 && !lost {
			// Full: wait for a task to finish; look again now and then.
			select {
			case <-ctx.Done():
			case <-s.leases.freed():
			case <-s.clock.After(s.opts.RequeueAfter):
			}
			continue
		}
		polled := s.clock.Now()
		leases, err := s.opts.Client.Poll(ctx, free, capacityMax(s.opts.MaxConcurrent, s.opts.MaxQueued, s.leases.kueue), held, s.opts.PollWait)
		if err == nil {
			s.opts.Recorder.Polled(s.clock.Now())
		}
		if err == nil && len(leases) == 0 {
			// An orchestrator (or a proxy) that answers at once instead of
			// holding the poll would be polled in a tight loop.
			s.wait(ctx, polled.Add(minPollInterval).Sub(s.clock.Now()))
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if IsFatal(err) {
				return refused(err)
			}
			s.opts.Recorder.SourceError("poll")
			d := s.opts.Backoff.Delay(failures, err)
			failures++
			s.log.Error(err, "polling the orchestrator failed; retrying", "in", d.Round(time.Millisecond).String(), "failures", failures)
			s.wait(ctx, d)
			continue
		}
		failures = 0
		s.take(ctx, leases, free)
	}
	return nil
}

// take starts the tasks of new leases and updates re-issued ones. New
// leases beyond free, the capacity the poll asked for, are handed back
// unused: an orchestrator that sends more must not run this dispatcher past
// --max-concurrent. What it starts is among s.goroutines.
func (s *Source) take(ctx context.Context, leases []Lease, free int) {
	now := s.clock.Now()
	var fresh []*task
	var leasesOf, extra []Lease
	for _, l := range leases {
		t, d, held, record := s.leases.take(l, now, s.opts.PollWait, len(fresh) < free)
		switch d {
		case deliveredMalformed:
			s.log.Error(nil, "the orchestrator sent a lease without a task or lease ID; ignored", "task", l.Task.ID, "lease", l.LeaseID)
		case deliveredEnded:
			s.log.Info("a lease of a task that has ended was delivered again; ignored", "task", l.Task.ID, "lease", l.LeaseID)
		case deliveredExpired:
			// Its events would be refused, and the record of its task's end
			// (keepFor) may be gone: not started. The orchestrator hands the
			// task out again if it has not ended. A clock far ahead of the
			// orchestrator's has every lease look like this.
			s.log.Info("a lease arrived expired (a late delivery, or this clock is ahead of the orchestrator's); ignored", "task", l.Task.ID, "lease", l.LeaseID, "expiresAt", l.ExpiresAt, "now", now.UTC())
		case deliveredDuplicate:
			// A duplicate delivery of a lease already held.
		case deliveredOlder:
			// A late delivery of a lease older than the one held: the task
			// was handed back since, and the orchestrator refuses the older
			// epoch's events.
			s.log.Info("a lease older than the one held was delivered; ignored", "task", l.Task.ID, "lease", l.LeaseID, "epoch", l.Epoch, "heldLease", held.leaseID, "heldEpoch", held.epoch)
		case deliveredReissued:
			// Handed back (a new epoch) after the lease expired: carry on
			// with the Job there is.
			if record {
				s.goroutines.Go(func() { s.recordLease(ctx, t) })
			}
		case deliveredBeyond:
			extra = append(extra, l)
		case deliveredFresh:
			fresh = append(fresh, t)
			leasesOf = append(leasesOf, l)
		}
	}
	for _, l := range extra {
		s.log.Info("the orchestrator sent more leases than the capacity asked for; handing this one back", "task", l.Task.ID, "lease", l.LeaseID, "asked", free)
		s.goroutines.Go(func() { s.release(ctx, l) })
	}
	s.opts.Recorder.Leased(len(fresh))
	for i, t := range fresh {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		s.goroutines.Go(func() {
			defer func() { <-s.slots }()
			s.start(ctx, t, leasesOf[i])
		})
	}
}

// release hands an unused lease back. A lease that cannot be handed back
// expires on the orchestrator's side, which then hands the task out again:
// either way it is not run here.
func (s *Source) release(ctx context.Context, l Lease) {
	if err := s.opts.Client.Release(ctx, l.LeaseID, l.Epoch); err != nil && ctx.Err() == nil {
		s.log.Error(err, "handing a lease back failed; it expires on its own", "task", l.Task.ID, "lease", l.LeaseID)
	}
}

// start creates the Job of a newly leased task, or reports it refused.
func (s *Source) start(ctx context.Context, t *task, l Lease) {
	j, secret, err := leaseJob(l, s.opts.Namespace, s.opts.Jobs)
	if err != nil {
		s.refuse(ctx, t, err)
		return
	}
	key := client.ObjectKeyFromObject(j)
	if s.endedBefore(ctx, key, l) {
		s.log.Info("a lease of a task that has ended was delivered again (its Job is the record); ignored", "task", t.id, "lease", l.LeaseID, "job", key.Name)
		s.leases.forget(t)
		return
	}
	s.leases.bind(t, key)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := s.create(ctx, j, secret)
		if err == nil {
			break
		}
		if job.IsPermanent(err) {
			// The API server will never take this Job (say, the task's
			// resources do not validate): the task fails, the slot frees.
			s.leases.unbind(t)
			if errors.Is(err, job.ErrSecretTaken) || errors.Is(err, job.ErrJobTaken) {
				s.refuse(ctx, t, fmt.Errorf("%w: %w", job.ErrInvalidTask, err))
			} else {
				// err names the Job or the Secret the API server refused.
				s.refuse(ctx, t, fmt.Errorf("%w: the API server refuses it: %w", job.ErrInvalidTask, err))
			}
			return
		}
		d := s.opts.Backoff.Delay(attempt, nil)
		s.log.Error(err, "creating the task's Job failed; retrying", "task", t.id, "in", d.Round(time.Millisecond).String())
		s.wait(ctx, d)
	}
	if ctx.Err() != nil {
		return
	}
	v := s.leases.created(t)
	if v.epoch != l.Epoch && s.leases.record(t) {
		// Handed back while the Job was being created: the Job holds the
		// first lease.
		s.recordLease(ctx, t)
		return
	}
	s.enqueue(ctx, key)
}

// endedBefore tells whether the Job at key records that lease l ended: it
// was reported under that very lease (finish marks it, keepFor keeps it).
// The cache answers: every replica's is warm before it leads.
func (s *Source) endedBefore(ctx context.Context, key types.NamespacedName, l Lease) bool {
	var j batchv1.Job
	if err := s.opts.Kube.Get(ctx, key, &j); err != nil {
		return false
	}
	return reportedMark(&j) && j.Annotations[AnnotationLeaseID] == l.LeaseID
}

// create makes the task's Secret and Job, or adopts the Job with this
// lease.
func (s *Source) create(ctx context.Context, j *batchv1.Job, secret *corev1.Secret) error {
	// The orchestrator handing the task out again means it has no final
	// event from the lease before: report it again if the Job says it was.
	adopt := map[string]any{
		AnnotationLeaseID: j.Annotations[AnnotationLeaseID], AnnotationLeaseEpoch: j.Annotations[AnnotationLeaseEpoch],
		AnnotationLeaseSeconds: j.Annotations[AnnotationLeaseSeconds], AnnotationReported: nil,
	}
	created, err := job.Create(ctx, s.opts.Kube, j, secret, job.CreateOptions{Adopt: adopt, SecretWait: s.opts.SecretGCWait})
	if created {
		s.opts.Recorder.JobCreated()
	}
	return err
}

// leaseJob is the Job (and Secret) of a lease's task, in namespace, or
// why the task can never run: another namespace, a variable that is not a
// value, a quantity Kubernetes cannot read (jobTask), or anything
// job.Build refuses.
func leaseJob(l Lease, namespace string, o job.Options) (*batchv1.Job, *corev1.Secret, error) {
	jt, err := jobTask(l.Task, namespace)
	if err != nil {
		return nil, nil, err
	}
	j, secret, err := job.Build(jt, o)
	if err != nil {
		return nil, nil, err
	}
	for k, v := range leaseAnnotations(l) {
		j.Annotations[k] = v
	}
	return j, secret, nil
}

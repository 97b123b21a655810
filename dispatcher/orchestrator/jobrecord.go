package orchestrator

import (
	"context"
	"encoding/json"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// Annotations the orchestrator source keeps on its Jobs: the Job is the
// durable record of the lease and of whether the outcome was reported.
const (
	AnnotationLeaseID      = "runwarden.dev/lease-id"
	AnnotationLeaseEpoch   = "runwarden.dev/lease-epoch"
	AnnotationLeaseSeconds = "runwarden.dev/lease-seconds"
	// AnnotationOutcome holds an outcome the dispatcher decided (a pod that
	// cannot start, a cancellation) before it stops the Job's pod, so the
	// outcome survives a restart.
	AnnotationOutcome = "runwarden.dev/outcome"
	// AnnotationReported is "true" once the orchestrator acknowledged the
	// final event.
	AnnotationReported = job.AnnotationReported
)

// recordLease writes the task's current lease into its Job's annotations,
// if no write is in flight for the task (that one writes it next). Writes
// for one task go one at a time, each writing the lease current when it is
// sent, until the last holds the newest lease: the task may be handed back
// twice in quick succession.
func (s *Source) recordLease(ctx context.Context, t *task) {
	for again := true; again; {
		v, _ := s.leases.view(t)
		l := Lease{LeaseID: v.leaseID, Epoch: v.epoch, LeaseSeconds: v.seconds}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": leaseAnnotations(l)}})
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: v.key.Namespace, Name: v.key.Name}}
		if err := s.opts.Kube.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
			s.log.Error(err, "recording the re-issued lease on the Job", "job", v.key.Name)
		}
		again = s.leases.recorded(t, v.epoch) && ctx.Err() == nil
		s.enqueue(ctx, v.key)
	}
}

func leaseAnnotations(l Lease) map[string]string {
	return map[string]string{
		AnnotationLeaseID:      l.LeaseID,
		AnnotationLeaseEpoch:   strconv.FormatInt(l.Epoch, 10),
		AnnotationLeaseSeconds: strconv.Itoa(l.LeaseSeconds),
	}
}

// outcome is the outcome recorded on the Job (stop), if it is believed
// (recordedOutcome, and with Kueue the Job's Workloads deactivated, as stop
// leaves them), else the observed one.
func (s *Source) outcome(ctx context.Context, j *batchv1.Job) (job.Outcome, error) {
	if out, ok := recordedOutcome(j); ok {
		if j.Labels[job.LabelQueueName] == "" {
			return out, nil
		}
		st, err := job.ReadQueueState(ctx, s.opts.Reader, j)
		if err != nil {
			return job.Outcome{}, err
		}
		if st.Inactive {
			return out, nil
		}
	}
	if j.Annotations[AnnotationOutcome] != "" {
		s.log.Info("the Job carries an outcome this dispatcher did not record (not stopped as stop leaves it); not believed, its outcome is observed", "job", j.Name)
	}
	return s.observer.Outcome(ctx, j)
}

// stoppedReasons are the reasons of the outcomes stop records: a task that
// failed, or was cancelled, while its Job still ran.
var stoppedReasons = map[string]bool{
	job.ReasonImagePullError: true, job.ReasonInvalidImage: true, job.ReasonContainerConfig: true, job.ReasonFailedMount: true,
	job.ReasonAdmission: true, job.ReasonUnschedulable: true, job.ReasonEvicted: true, job.ReasonPreempted: true,
	job.ReasonCancelled: true, job.ReasonSecretResolution: true, job.ReasonFailed: true,
}

// recordedOutcome is the outcome stop recorded on Job j, and whether it is
// believed. Who writes it: the dispatcher (stop), together with the Job's
// suspension, in one patch. The chart's writers policy lets no one else
// change a runner Job's runwarden.dev/ annotations, and its Jobs policy no
// one but the dispatcher and Kueue its spec; so that a deployment without
// the writers policy is not told a running task's outcome by whoever may
// patch Jobs (the task reported over while it runs, its Job then never
// stopped, and later deleted while it runs), the annotation is believed
// only as stop leaves it: on a suspended Job, a failure or a cancellation
// (stop never records a success) of one of the reasons stop records.
func recordedOutcome(j *batchv1.Job) (job.Outcome, bool) {
	raw := j.Annotations[AnnotationOutcome]
	if raw == "" || !ptr.Deref(j.Spec.Suspend, false) {
		return job.Outcome{}, false
	}
	var out job.Outcome
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return job.Outcome{}, false
	}
	if (out.Phase != job.PhaseFailed && out.Phase != job.PhaseCancelled) || !stoppedReasons[out.Reason] {
		return job.Outcome{}, false
	}
	out.Stop, out.Running, out.Queued, out.Unread = true, false, false, false
	return out, true
}

// stoppedOutcome tells whether stop recorded an outcome on Job j and
// stopped it (recordedOutcome).
func stoppedOutcome(j *batchv1.Job) bool {
	_, ok := recordedOutcome(j)
	return ok
}

// reportedMark tells whether Job j carries the mark that its outcome was
// acknowledged (Settler.Mark). Who writes it: the dispatcher, on a Job that
// finished or that stop stopped; the chart's writers policy lets no one
// else. On a Job that still runs it is not believed: the task would be
// forgotten while it runs, its lease no longer renewed, and handed out
// again.
func reportedMark(j *batchv1.Job) bool {
	if j.Annotations[AnnotationReported] == "" {
		return false
	}
	_, stopped := recordedOutcome(j)
	return job.Finished(j) || stopped
}

// stop stops the Job's pod when the outcome came before the Job's end: it
// records the outcome on the Job and suspends it, in one write, so the
// outcome survives a restart and the Job stays as the record until the
// report is acknowledged. The Job of an outcome recorded already is
// suspended. gone says the Job went meanwhile.
func (s *Source) stop(ctx context.Context, j *batchv1.Job, out job.Outcome) (gone bool, err error) {
	if j == nil || !out.Stop {
		return false, nil
	}
	if _, recorded := recordedOutcome(j); recorded {
		return false, nil
	}
	// Kueue starts a suspended Job again while its Workload stays
	// admitted: deactivate the Workload first.
	if err := job.Deactivate(ctx, s.opts.Kube, s.opts.Reader, j); err != nil {
		return false, err
	}
	rec, _ := json.Marshal(job.Outcome{Phase: out.Phase, Reason: out.Reason, Message: out.Message, ExitCode: out.ExitCode})
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{AnnotationOutcome: string(rec)}},
		"spec":     map[string]any{"suspend": true},
	})
	err = s.opts.Kube.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

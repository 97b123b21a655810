package job

import (
	"context"
	"fmt"
	"sort"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What Kueue (kueue.x-k8s.io) reads on a Job, and labels on its Workloads.
const (
	// LabelQueueName names the Job's LocalQueue: Kueue admits the Job.
	LabelQueueName = "kueue.x-k8s.io/queue-name"
	// LabelPriorityClass names the Job's WorkloadPriorityClass.
	LabelPriorityClass = "kueue.x-k8s.io/priority-class"
	// labelJobUID is on each Workload Kueue makes for a Job: the Job's UID.
	labelJobUID = "kueue.x-k8s.io/job-uid"
)

// ReasonPreempted is the outcome of a task whose Job Kueue evicted after
// admitting it, to make room for a higher-priority one. The task is not
// run again: a runner stopped mid-run (an apply holding its state lock)
// is for a person to look at.
const ReasonPreempted = "Preempted"

// ReasonQueued is the status reason of a task whose Job waits in Kueue.
const ReasonQueued = "Queued"

// WorkloadGVK is the Kueue API version the dispatcher reads Workloads at.
var WorkloadGVK = schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "Workload"}

// Queueing says how tasks wait for a slot.
type Queueing struct {
	// Kueue makes each Job a Kueue workload: labelled with its LocalQueue
	// (LabelQueueName) and WorkloadPriorityClass (LabelPriorityClass), and
	// made suspended for Kueue to admit. Default: off, the dispatcher's own
	// --max-concurrent slots in priority, then creation, order.
	Kueue bool
	// DefaultQueue is the LocalQueue of tasks that name none. With Kueue, a
	// task without a queue and without this default is refused.
	DefaultQueue string
	// DefaultPriorityClass is the priority class of tasks that name none.
	// Default: none (priority 0 without Kueue; Kueue's default with it).
	DefaultPriorityClass string
	// Priorities are the values of the priority class names tasks may use
	// without Kueue (a higher value starts first). With Kueue the names are
	// WorkloadPriorityClasses and Kueue knows their values.
	Priorities map[string]int32
}

// Queue is the LocalQueue and priority class of a task, its own or the
// defaults.
func (q Queueing) Queue(queue, priorityClass string) (string, string) {
	if queue == "" {
		queue = q.DefaultQueue
	}
	if priorityClass == "" {
		priorityClass = q.DefaultPriorityClass
	}
	return queue, priorityClass
}

// Priority is the value of a priority class without Kueue: 0 for none, an
// error naming the known classes for one the dispatcher does not know.
func (q Queueing) Priority(priorityClass string) (int32, error) {
	_, pc := q.Queue("", priorityClass)
	if pc == "" {
		return 0, nil
	}
	v, ok := q.Priorities[pc]
	if !ok {
		known := make([]string, 0, len(q.Priorities))
		for k := range q.Priorities {
			known = append(known, k)
		}
		sort.Strings(known)
		if len(known) == 0 {
			return 0, fmt.Errorf("%w: priority class %q: this dispatcher knows no priority classes (--priority-class NAME=VALUE)", ErrInvalidTask, pc)
		}
		return 0, fmt.Errorf("%w: priority class %q is not one this dispatcher knows (%s)", ErrInvalidTask, pc, strings.Join(known, ", "))
	}
	return v, nil
}

// queueJob labels a built Job for Kueue and makes it suspended, or, without
// Kueue, checks the task's priority class.
func (q Queueing) queueJob(j *batchv1.Job, t Task) error {
	queue, pc := q.Queue(t.Queue, t.PriorityClass)
	for what, v := range map[string]string{"queue": queue, "priority class": pc} {
		if v != "" && len(validation.IsDNS1123Subdomain(v)) > 0 {
			return fmt.Errorf("%w: %s %q is not a valid object name", ErrInvalidTask, what, v)
		}
	}
	if !q.Kueue {
		_, err := q.Priority(pc)
		return err
	}
	if queue == "" {
		return fmt.Errorf("%w: task %s names no queue and the dispatcher has no default queue (--default-queue)", ErrInvalidTask, t.ID)
	}
	j.Labels[LabelQueueName] = queue
	if pc != "" {
		j.Labels[LabelPriorityClass] = pc
	}
	j.Spec.Suspend = ptr.To(true)
	return nil
}

// Queued tells whether a Job waits for Kueue to admit it: it has a queue,
// is suspended and its Secret (if any) is made. Kueue unsuspends it on
// admission. A Job stopped by the dispatcher is suspended too: callers
// tell those apart by their own marks first.
func Queued(j *batchv1.Job) bool {
	return j.Labels[LabelQueueName] != "" && ptr.Deref(j.Spec.Suspend, false) &&
		j.Annotations[AnnotationAwaitingSecret] == "" && !Finished(j)
}

// QueueState is what Kueue says of a Job that waits, or that it evicted.
type QueueState struct {
	// Workload is the name of the Job's Kueue Workload, if it has one yet.
	Workload string
	// Message says why the Job waits (Kueue's QuotaReserved condition).
	Message string
	// Evicted is the outcome of a Job Kueue evicted after admitting it:
	// Preempted, or Evicted for any other cause. Its Stop is set.
	Evicted *Outcome
	// Inactive is true when the Job has a Workload and every one is
	// inactive (spec.active false): Deactivate made them so, before the
	// dispatcher stopped the Job.
	Inactive bool
}

// ReadQueueState reads the Kueue Workload of Job j (read from the API
// server with r: Workloads are not cached) and says whether it waits and
// why, or was evicted after admission.
//
// Who writes them: Kueue makes a Job's Workload, labelled with the Job's
// UID, and writes its status; the dispatcher deactivates it. The chart's
// writers policy, with queueing.kueue on, lets no one else create or
// change a Workload of the runner namespace labelled with a Job's UID, so
// no user can plant one that evicts a task's Job.
func ReadQueueState(ctx context.Context, r client.Reader, j *batchv1.Job) (QueueState, error) {
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(WorkloadGVK.GroupVersion().WithKind("WorkloadList"))
	if err := r.List(ctx, &list, client.InNamespace(j.Namespace), client.MatchingLabels{labelJobUID: string(j.UID)}); err != nil {
		return QueueState{}, fmt.Errorf("reading the Kueue workload of job %s: %w", j.Name, err)
	}
	queue := j.Labels[LabelQueueName]
	st := QueueState{Message: fmt.Sprintf("queued in LocalQueue %s: waiting for Kueue to make its workload", queue)}
	st.Inactive = len(list.Items) > 0
	for i := range list.Items {
		wl := &list.Items[i]
		if active, found, _ := unstructured.NestedBool(wl.Object, "spec", "active"); !found || active {
			st.Inactive = false
		}
		st.Workload = wl.GetName()
		st.Message = fmt.Sprintf("queued in LocalQueue %s: waiting for admission", queue)
		if c := condition(wl, "QuotaReserved"); c != nil && c["status"] == "False" && c["message"] != nil {
			st.Message = fmt.Sprintf("queued in LocalQueue %s: %v", queue, c["message"])
		}
		if reason, msg, ok := evicted(wl); ok {
			out := Outcome{Phase: PhaseFailed, Reason: ReasonEvicted, Stop: true,
				Message: fmt.Sprintf("Kueue evicted the task's workload %s after admitting it (%s): %s; a runner stopped mid-run is not started again", wl.GetName(), reason, msg)}
			if reason == ReasonPreempted {
				out.Reason = ReasonPreempted
			}
			st.Evicted = &out
		}
	}
	return st, nil
}

// condition is a Workload's status condition of that type, if any.
func condition(wl *unstructured.Unstructured, typ string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

// evicted tells whether Kueue evicted a Workload after admitting it: its
// Evicted condition is true, or its scheduling stats count an eviction
// (kept after Kueue admits it again).
func evicted(wl *unstructured.Unstructured) (reason, message string, ok bool) {
	if c := condition(wl, "Evicted"); c != nil && c["status"] == "True" {
		return fmt.Sprint(c["reason"]), fmt.Sprint(c["message"]), true
	}
	stats, _, _ := unstructured.NestedSlice(wl.Object, "status", "schedulingStats", "evictions")
	for _, s := range stats {
		if m, ok := s.(map[string]any); ok {
			msg := "evicted before"
			if c := condition(wl, "Preempted"); c != nil {
				msg = fmt.Sprint(c["message"])
			}
			return fmt.Sprint(m["reason"]), msg, true
		}
	}
	return "", "", false
}

// Deactivate stops Kueue from admitting Job j again: its Workloads are
// made inactive (spec.active false), which Kueue answers by evicting them
// and keeping the Job suspended. A suspension alone is undone by Kueue
// while the Workload stays admitted. A Job without a Workload is not an
// error.
func Deactivate(ctx context.Context, c client.Client, r client.Reader, j *batchv1.Job) error {
	if j.Labels[LabelQueueName] == "" || j.UID == "" {
		return nil
	}
	var list unstructured.UnstructuredList
	list.SetGroupVersionKind(WorkloadGVK.GroupVersion().WithKind("WorkloadList"))
	if err := r.List(ctx, &list, client.InNamespace(j.Namespace), client.MatchingLabels{labelJobUID: string(j.UID)}); err != nil {
		return fmt.Errorf("reading the Kueue workload of job %s: %w", j.Name, err)
	}
	for i := range list.Items {
		wl := &list.Items[i]
		if err := c.Patch(ctx, wl, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"active":false}}`))); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deactivating the Kueue workload %s of job %s: %w", wl.GetName(), j.Name, err)
		}
	}
	return nil
}

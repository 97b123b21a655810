package job

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/internal/resolve"
)

// Reasons of a task's outcome; a bounded set, used as metric labels and in
// reports.
const (
	ReasonCompleted        = "Completed"
	ReasonNonZeroExit      = "NonZeroExit"
	ReasonDeadlineExceeded = "DeadlineExceeded"
	ReasonOOMKilled        = "OOMKilled"
	ReasonImagePullError   = "ImagePullError"
	ReasonInvalidImage     = "InvalidImage"
	ReasonContainerConfig  = "CreateContainerConfigError"
	ReasonFailedMount      = "FailedMount"
	ReasonEvicted          = "Evicted"
	ReasonRefused          = "Refused"
	ReasonCancelled        = "Cancelled"
	ReasonFailed           = "Failed"
	ReasonAdmission        = "AdmissionRejected"
	ReasonUnschedulable    = "Unschedulable"
	// ReasonRunnerNotSucceeded: the Job reports success, but no pod of its
	// own (IsPodOf) has its runner container terminated with exit code 0,
	// the one proof of success runwarden believes. A pod planted with the
	// Job's selector and adopted by the Job controller completes the Job
	// when it exits 0, whatever became of the runner.
	ReasonRunnerNotSucceeded = "RunnerNotSucceeded"
	// ReasonSecretResolution: the init container that resolves the task's
	// secret references failed; its message names the variable and the
	// reference.
	ReasonSecretResolution = "SecretResolutionFailed"
)

// Phases of a finished task.
const (
	PhaseSucceeded = "Succeeded"
	PhaseFailed    = "Failed"
	PhaseCancelled = "Cancelled"
)

// Outcome is how a task's Job went so far.
type Outcome struct {
	// Phase is PhaseSucceeded or PhaseFailed once the task is over, else
	// empty.
	Phase string
	// Reason is one of the Reason constants when Phase is set.
	Reason  string
	Message string
	// ExitCode is the runner container's, once it terminated.
	ExitCode *int32
	// Running is true once the runner container has started.
	Running bool
	// Queued is true while the Job waits for Kueue to admit it; Message
	// says where and why.
	Queued bool
	// Unread is true, with Queued, while Kueue has not made the Job's
	// Workload yet: it says why the Job waits soon, look again then.
	Unread bool
	// Stop is true when the task failed while the Job still runs (its pod
	// cannot start or be scheduled): the caller stops the Job.
	Stop bool
}

// Observer reads a Job's outcome from the Job, its pods and their Warning
// events.
type Observer struct {
	// Client reads Jobs' pods (a label-filtered cache is enough).
	Client client.Reader
	// Events reads Warning events; they are not in a label-filtered cache.
	Events client.Reader
	// UnschedulableTimeout fails a task whose pod stays unschedulable this
	// long. Default: 5m.
	UnschedulableTimeout time.Duration
	// FailedMountTimeout fails a task whose pod cannot mount its volumes
	// this long after it was created. Default: 1m.
	FailedMountTimeout time.Duration
	// Now is the clock. Default: time.Now.
	Now func() time.Time
	// Workloads reads the Kueue Workloads of Jobs that wait in Kueue (from
	// the API server: they are not cached). Default: none, and such a Job
	// is queued with no more said.
	Workloads client.Reader
}

func (o Observer) now() time.Time {
	if o.Now == nil {
		return time.Now()
	}
	return o.Now()
}

// Succeeded tells whether a Job succeeded.
func Succeeded(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobSuccessCriteriaMet) {
			return true
		}
	}
	return false
}

// Finished tells whether a Job is over, by its final or its interim
// (FailureTarget, SuccessCriteriaMet) conditions.
func Finished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue && slices.Contains([]batchv1.JobConditionType{
			batchv1.JobComplete, batchv1.JobFailed, batchv1.JobSuccessCriteriaMet, batchv1.JobFailureTarget,
		}, c.Type) {
			return true
		}
	}
	return false
}

// Outcome reads how the Job went.
func (o Observer) Outcome(ctx context.Context, j *batchv1.Job) (Outcome, error) {
	if Queued(j) {
		if o.Workloads == nil {
			return Outcome{Queued: true, Message: "queued in LocalQueue " + j.Labels[LabelQueueName]}, nil
		}
		st, err := ReadQueueState(ctx, o.Workloads, j)
		if err != nil {
			return Outcome{}, err
		}
		if st.Evicted != nil {
			return *st.Evicted, nil
		}
		return Outcome{Queued: true, Unread: st.Workload == "", Message: st.Message}, nil
	}
	unschedulable := o.UnschedulableTimeout
	if unschedulable <= 0 {
		unschedulable = 5 * time.Minute
	}
	mountTimeout := o.FailedMountTimeout
	if mountTimeout <= 0 {
		mountTimeout = time.Minute
	}
	// Only the Job's own pods (IsPodOf): a pod planted with its job-name
	// label must not fail, stop or describe the task. Read-only: a cache's
	// objects are not copied.
	pods, err := PodsOf(ctx, o.Client, j, true)
	if err != nil {
		return Outcome{}, err
	}
	st := podState(pods)
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobSuccessCriteriaMet:
			return completed(c, pods, st), nil
		case batchv1.JobFailed, batchv1.JobFailureTarget:
			reason := ReasonFailed
			switch {
			case c.Reason == batchv1.JobReasonDeadlineExceeded:
				reason = ReasonDeadlineExceeded
			case st.reason != "":
				reason = st.reason
			case st.exit != nil && *st.exit != 0:
				reason = ReasonNonZeroExit
			}
			msg := withEvents(strings.TrimSpace(c.Message+" "+st.message), o.warnings(ctx, "Pod", j.Namespace, podRefs(pods)))
			return Outcome{Phase: PhaseFailed, Reason: reason, Message: msg, ExitCode: st.exit, Running: st.running}, nil
		}
	}
	// Fail fast on pods that cannot start.
	if st.reason == ReasonImagePullError || st.reason == ReasonInvalidImage || st.reason == ReasonContainerConfig {
		return Outcome{Phase: PhaseFailed, Reason: st.reason, Message: withEvents(st.message, o.warnings(ctx, "Pod", j.Namespace, podRefs(pods))), Stop: true}, nil
	}
	now := o.now()
	if len(pods) == 0 && now.Sub(j.CreationTimestamp.Time) >= 2*time.Second {
		// The Job controller could not create the pod because admission
		// denied it. A webhook that could not be called is not a denial: the
		// Job controller retries, and so does this check. (Not in a Job's
		// first seconds: its pod is normally on its way, and reading events
		// costs the API server a scan of the namespace's events.)
		// Each event is read on its own: one failed call quoting a webhook's
		// "is forbidden" must not read as a denial, nor hide a later one.
		events := o.warningEvents(ctx, "Job", j.Namespace, []objectRef{{name: j.Name, uid: j.UID}})
		for _, e := range events {
			if e.Reason == "FailedCreate" && DeniedByAdmission(e.Message) {
				return Outcome{Phase: PhaseFailed, Reason: ReasonAdmission, Message: eventText(events), Stop: true}, nil
			}
		}
	}
	for _, p := range pods {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
				now.Sub(p.CreationTimestamp.Time) > unschedulable {
				msg := fmt.Sprintf("unschedulable for more than %s: %s", unschedulable, c.Message)
				return Outcome{Phase: PhaseFailed, Reason: ReasonUnschedulable, Message: msg, Stop: true}, nil
			}
		}
		// A pod still creating its containers past the mount timeout with
		// FailedMount warnings will not start: a Secret or ConfigMap it
		// mounts is missing, or a volume cannot attach.
		if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodPending && !st.running && now.Sub(p.CreationTimestamp.Time) > mountTimeout {
			if w := o.warnings(ctx, "Pod", j.Namespace, []objectRef{{name: p.Name, uid: p.UID}}); strings.Contains(w, "FailedMount") {
				return Outcome{Phase: PhaseFailed, Reason: ReasonFailedMount, Message: w, Stop: true}, nil
			}
		}
	}
	return Outcome{Running: st.running}, nil
}

// completed is the outcome of a Job whose condition c says it succeeded.
// The condition is the Job controller's (jobs/status, which the chart's
// writers policy lets only the controllers it names write), but the Job
// controller counts any pod it adopted through the Job's selector: one
// that a user who may create pods planted with the label
// batch.kubernetes.io/controller-uid completes the Job when it exits 0,
// and the Job controller then stops the runner. So success is believed
// only from a pod of the Job's own (IsPodOf: the runner label, which only
// the Job controller's pods of a dispatcher's Job earn, and the Job's
// controller reference) whose runner container terminated with exit code
// 0; the container statuses are the kubelet's (pods/status, kept to the
// kubelets and the controllers by the same policy). While a pod of its own
// has not ended (the Job's status can reach the cache before its pod's),
// the task is not over yet; otherwise it failed: ReasonRunnerNotSucceeded.
func completed(c batchv1.JobCondition, pods []corev1.Pod, st runnerState) Outcome {
	if st.exit != nil && *st.exit == 0 {
		return Outcome{Phase: PhaseSucceeded, Reason: ReasonCompleted, Message: c.Message, ExitCode: st.exit, Running: true}
	}
	for i := range pods {
		if p := &pods[i]; p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && !runnerEnded(p) {
			return Outcome{Running: st.running}
		}
	}
	msg := "the Job reports success, but no pod of its own has its runner container terminated with exit code 0"
	switch {
	case len(pods) == 0:
		msg += " (it has no pod of its own left: a pod it adopted through its selector ended it, or its pod was deleted)"
	case st.exit != nil:
		msg += fmt.Sprintf(" (the runner exited %d)", *st.exit)
	}
	return Outcome{Phase: PhaseFailed, Reason: ReasonRunnerNotSucceeded, Message: strings.TrimSpace(msg + ": " + c.Message), ExitCode: st.exit, Running: st.running}
}

// runnerEnded tells whether pod p's runner container has terminated.
func runnerEnded(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == RunnerContainer && s.State.Terminated != nil {
			return true
		}
	}
	return false
}

// DeniedByAdmission tells a denial by an admission webhook or policy from a
// failed call to a webhook, in one FailedCreate message of the Job
// controller. The API server words a denial "admission webhook "<name>"
// denied the request: ..." (or "... is forbidden: ..." for Pod Security, a
// quota or a ValidatingAdmissionPolicy), and a webhook it could not call, or
// that could not decide (answered with an HTTP error), "Internal error
// occurred: failed calling webhook "<name>": ..." followed by what the
// webhook said, which may itself quote "is forbidden" (a read it was
// refused). Whichever of its words comes first is what the API server said.
func DeniedByAdmission(msg string) bool {
	failed := strings.Index(msg, `failed calling webhook "`)
	denied := -1
	for _, w := range []string{"denied the request", "is forbidden"} {
		if i := strings.Index(msg, w); i >= 0 && (denied < 0 || i < denied) {
			denied = i
		}
	}
	return denied >= 0 && (failed < 0 || denied < failed)
}

func podNames(pods []corev1.Pod) []string {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name
	}
	return names
}

func podRefs(pods []corev1.Pod) []objectRef {
	refs := make([]objectRef, len(pods))
	for i, p := range pods {
		refs[i] = objectRef{name: p.Name, uid: p.UID}
	}
	return refs
}

// maxEventText bounds the Warning events quoted in a failure message.
const maxEventText = 1024

// warnings returns the Warning events of the named objects, as
// "Reason: message" lines, bounded in length.
func (o Observer) warnings(ctx context.Context, kind, namespace string, refs []objectRef) string {
	return eventText(o.warningEvents(ctx, kind, namespace, refs))
}

// objectRef names an object whose events are read, with its UID.
type objectRef struct {
	name string
	uid  types.UID
}

// warningEvents returns the Warning events of the named objects (none when
// they cannot be listed).
//
// Who writes them: anyone who may create events in the namespace, as far as
// RBAC goes. The events of a runner Job or pod (named NamePrefix...) are
// believed because the chart's writers policy (templates/writers-policy.yaml)
// lets only the kubelets, the scheduler, the controller manager's
// controllers (the Job controller's FailedCreate among them), Kueue and
// the chart's other named writers create or change them; a deployment
// without that policy trusts whoever may create events there.
func (o Observer) warningEvents(ctx context.Context, kind, namespace string, refs []objectRef) []corev1.Event {
	events := o.Events
	if events == nil {
		events = o.Client
	}
	var all []corev1.Event
	for _, ref := range refs {
		var list corev1.EventList
		if err := events.List(ctx, &list, client.InNamespace(namespace), client.MatchingFields{"involvedObject.name": ref.name}); err != nil {
			return nil
		}
		for _, e := range list.Items {
			// An event about an earlier object of the same name (a Job
			// deleted and made again) is not this one's.
			if e.Type == corev1.EventTypeWarning && e.InvolvedObject.Kind == kind && (e.InvolvedObject.UID == "" || ref.uid == "" || e.InvolvedObject.UID == ref.uid) {
				all = append(all, e)
			}
		}
	}
	return all
}

// JobWarnings returns the Warning events about Job j itself (its kind, its
// name and, where the event names one, its UID), as Outcome reads them:
// not those about another object of its name.
func (o Observer) JobWarnings(ctx context.Context, j *batchv1.Job) []corev1.Event {
	return o.warningEvents(ctx, "Job", j.Namespace, []objectRef{{name: j.Name, uid: j.UID}})
}

// eventText quotes events as "Reason: message" lines, bounded in length.
func eventText(events []corev1.Event) string {
	var b strings.Builder
	for _, e := range events {
		line := e.Reason + ": " + e.Message
		if b.Len()+len(line) > maxEventText {
			break
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(line)
	}
	return b.String()
}

func withEvents(msg, events string) string {
	if events == "" {
		return msg
	}
	return strings.TrimSpace(msg + " (events: " + events + ")")
}

type runnerState struct {
	exit            *int32
	reason, message string
	running         bool
}

// podState reads the runner container: whether it started, its exit code,
// and a reason when it cannot start or was killed.
func podState(pods []corev1.Pod) runnerState {
	var st runnerState
	for _, p := range pods {
		if p.Status.Reason == "Evicted" {
			return runnerState{reason: ReasonEvicted, message: p.Status.Message}
		}
		for _, s := range p.Status.InitContainerStatuses {
			if t := s.State.Terminated; t != nil && t.ExitCode != 0 && s.Name == resolve.InitContainer {
				return runnerState{reason: ReasonSecretResolution, message: strings.TrimSpace(t.Message)}
			}
			if w := s.State.Waiting; w != nil {
				if r := waitingReason(w.Reason); r != "" {
					return runnerState{reason: r, message: fmt.Sprintf("init container %s: %s", s.Name, w.Message)}
				}
			}
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name != RunnerContainer {
				continue
			}
			if s.State.Running != nil {
				st.running = true
			}
			if t := s.State.Terminated; t != nil {
				code := t.ExitCode
				if t.Reason == "OOMKilled" {
					return runnerState{exit: &code, reason: ReasonOOMKilled, message: t.Message, running: true}
				}
				return runnerState{exit: &code, message: t.Message, running: true}
			}
			if w := s.State.Waiting; w != nil {
				if r := waitingReason(w.Reason); r != "" {
					return runnerState{reason: r, message: w.Message}
				}
			}
		}
	}
	return st
}

// waitingReason is the task's failure reason for a container that waits
// for something that will not come, else "".
func waitingReason(reason string) string {
	switch reason {
	case "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull":
		// ErrImageNeverPull: imagePullPolicy Never and the image is not on
		// the node; it never will be.
		return ReasonImagePullError
	case "InvalidImageName":
		return ReasonInvalidImage
	case "CreateContainerConfigError":
		return ReasonContainerConfig
	}
	return ""
}

package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/internal/contract"
)

// IsPermanent tells whether the API server refused a Job for what it is,
// so sending it again cannot succeed: the task is refused instead of
// retried. That is a Job that does not validate (422, 400), or one an
// admission webhook or a ValidatingAdmissionPolicy denied. A denial comes
// with the status its webhook or policy chose, most often 403 Forbidden
// (controller-runtime, Gatekeeper, Kyverno): the status alone would also
// match an RBAC refusal or an exhausted quota, which can pass later, so
// denials are told by the API server's own wording. A webhook that cannot be
// reached is a 500 and is retried.
//
// A Job or Secret too large for the API server (413: the request body past
// its limit, about 3 MiB) or for etcd (a 500 "request is too large": past
// etcd's --max-request-bytes, 1.5 MiB by default) can never be stored
// either. Neither can a task whose Secret's name someone else holds
// (ErrSecretTaken).
func IsPermanent(err error) bool {
	if errors.Is(err, ErrSecretTaken) || errors.Is(err, ErrJobTaken) {
		return true
	}
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsRequestEntityTooLargeError(err) {
		return true
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	s := st.Status()
	if strings.Contains(s.Message, "request is too large") {
		return true
	}
	if s.Code < 400 || s.Code >= 500 {
		return false
	}
	return (strings.Contains(s.Message, `admission webhook "`) && strings.Contains(s.Message, `" denied the request`)) ||
		(strings.Contains(s.Message, "ValidatingAdmissionPolicy '") && strings.Contains(s.Message, " denied request"))
}

// AnnotationAwaitingSecret marks a Job made suspended until its task's
// Secret exists (see Create). A Job that carries it has never run.
const AnnotationAwaitingSecret = "runwarden.dev/awaiting-secret"

// AwaitingSecret tells whether Job j was made awaiting its Secret and never
// resumed (Create): the dispatcher stopped between the Job and the resume,
// so its Secret may or may not be there. Who writes the mark: the
// dispatcher, on a Job it makes suspended, and no one else under the
// chart's writers policy; on a Job that is not suspended it is not
// believed, or a restart would delete a running task's Job.
func AwaitingSecret(j *batchv1.Job) bool {
	return j.Annotations[AnnotationAwaitingSecret] != "" && ptr.Deref(j.Spec.Suspend, false)
}

// ErrSecretTaken is a task Secret's name held by a Secret this task's Job
// does not own: made by someone else who may write Secrets in the runner
// namespace. It is never adopted: its values would reach the runner as the
// task's. The task is refused (IsPermanent).
var ErrSecretTaken = errors.New("the task's Secret name is taken by a Secret runwarden did not make for it")

// ErrJobTaken is a task Job's name held by a Job that is not a runner Job
// of that task: made by someone else who may create Jobs in the runner
// namespace, to have the dispatcher adopt it, report its outcome as the
// task's, or make the task's Secret owned by it. It is never adopted: the
// task is refused (IsPermanent).
var ErrJobTaken = errors.New("the task's Job name is taken by a Job runwarden did not make for it")

// DefaultSecretWait is how long Create waits for the garbage collector to
// remove a task Secret that a deleted Job owned, before taking the name for
// someone else's.
const DefaultSecretWait = 30 * time.Second

// CreateOptions shape Create.
type CreateOptions struct {
	// Adopt are the annotations an existing Job of the task gets (a nil
	// value removes one).
	Adopt map[string]any
	// SecretWait bounds the wait for a Secret owned by a deleted Job to go.
	// Default: DefaultSecretWait.
	SecretWait time.Duration
}

// Create makes the task's Job and its Secret (if any) as Build returned
// them. A Job that already exists (the task was started before a restart,
// or handed out twice) is adopted, never duplicated, if it is this task's
// runner Job (its pods carry contract.LabelRunner, which the chart's admission
// policy lets only the dispatcher set, and its contract.TaskID is the
// task's); any other Job of that name is someone else's: ErrJobTaken. An
// adopted Job gets j's dispatcher
// label (a dispatcher whose ID changed, or another one the task was handed
// to, takes it over: its cache sees only Jobs of its own ID) and the
// annotations in o.Adopt. created tells whether this call made the Job.
//
// The Secret is made with its owner already set, so the dispatcher needs no
// other verb than create on Secrets: the Job is made suspended and marked
// AnnotationAwaitingSecret, the Secret is made owned by it (it goes with the
// Job), and the Job is resumed. A Secret of that name that is there already
// is never adopted: it may be this task's from a start that stopped before
// the resume, owned by the Job, or anyone else's. The Job is deleted; the
// garbage collector removes a Secret it owned, and the task starts again
// with a new Job. A Secret that stays is someone else's: ErrSecretTaken. A
// Job the API server can never accept (IsPermanent) leaves nothing behind.
func Create(ctx context.Context, c client.Client, j *batchv1.Job, secret *corev1.Secret, o CreateOptions) (created bool, err error) {
	if o.SecretWait <= 0 {
		o.SecretWait = DefaultSecretWait
	}
	want := j.DeepCopy()
	// A Job for Kueue joins its queue only once its Secret is made: Kueue
	// ignores a Job without a queue, and would admit (unsuspend) one
	// awaiting its Secret.
	queue := map[string]any{}
	if secret != nil {
		want.Spec.Suspend = ptr.To(true)
		want.Annotations[AnnotationAwaitingSecret] = "true"
		for _, k := range []string{LabelQueueName, LabelPriorityClass} {
			if v, ok := want.Labels[k]; ok {
				queue[k] = v
				delete(want.Labels, k)
			}
		}
	}
	for round := 0; ; round++ {
		made, created, err := createJob(ctx, c, want, o.Adopt)
		if err != nil || secret == nil || made.Annotations[AnnotationAwaitingSecret] == "" {
			// No Secret, or an adopted Job that was resumed (its Secret made)
			// before.
			return created, err
		}
		s := secret.DeepCopy()
		if old := made.Annotations[AnnotationSecret]; old != s.Name {
			// Made awaiting its Secret by an earlier dispatcher, whose
			// Secrets were named like their Job: the chart's admission
			// policy no longer lets that name be made. The Job never ran;
			// it goes, and the next call makes the task's Job anew.
			if err := deleteJob(ctx, c, made); err != nil {
				return false, fmt.Errorf("job %s awaits secret %s, not %s (made by an earlier version); deleting it to start again: %w", made.Name, old, s.Name, err)
			}
			return false, fmt.Errorf("job %s awaited secret %s, not %s (made by an earlier version): deleted it, the task starts again", made.Name, old, s.Name)
		}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: made.Name, UID: made.UID, Controller: ptr.To(true)}}
		err = c.Create(ctx, s)
		if err == nil {
			return created, resume(ctx, c, made, queue)
		}
		if IsPermanent(err) {
			// The Secret can never be stored (too large, invalid): the
			// task is refused, and its Job must not stay behind.
			if derr := deleteJob(ctx, c, made); derr != nil {
				return false, fmt.Errorf("creating secret %s: %w (and deleting its job: %w)", s.Name, err, derr)
			}
			return false, fmt.Errorf("creating secret %s: %w", s.Name, err)
		}
		if !apierrors.IsAlreadyExists(err) {
			// The Job stays suspended, awaiting its Secret: the next call
			// adopts it and tries again.
			return created, fmt.Errorf("creating secret %s: %w", s.Name, err)
		}
		if err := deleteJob(ctx, c, made); err != nil {
			return false, fmt.Errorf("secret %s exists already; deleting job %s to start again: %w", s.Name, made.Name, err)
		}
		gone, err := secretGone(ctx, c, s, o.SecretWait)
		if err != nil {
			return false, err
		}
		if !gone || round == 2 {
			return false, fmt.Errorf("%w: secret %s in namespace %s is not owned by the task's Job (still there %s after that Job was deleted); whoever may write Secrets in the namespace made it, and the task does not run with its values", ErrSecretTaken, s.Name, s.Namespace, o.SecretWait)
		}
	}
}

// createJob makes j or adopts the Job of its name, and returns the Job as
// the API server holds it.
func createJob(ctx context.Context, c client.Client, j *batchv1.Job, adopt map[string]any) (*batchv1.Job, bool, error) {
	made := j.DeepCopy()
	err := c.Create(ctx, made)
	if err == nil {
		return made, true, nil
	}
	if !apierrors.IsAlreadyExists(err) && !IsPermanent(err) {
		return nil, false, fmt.Errorf("creating job %s: %w", j.Name, err)
	}
	// The API server validates before it looks for the name, so a Job
	// refused as invalid may still exist (created from an older pod
	// template): adopt it if so. Read it back from the API server (a cache
	// may not have it yet) through patches: the first only tests that it
	// is this task's runner Job and changes nothing, the second, which
	// tests that the Job is still the one the first proved, adopts it.
	cause := err
	made = &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Name: j.Name}}
	err = c.Patch(ctx, made, jsonPatch(proveOps(j.Annotations[contract.TaskID], "")))
	switch {
	case apierrors.IsNotFound(err) && IsPermanent(cause):
		return nil, false, fmt.Errorf("creating job %s: %w", j.Name, cause)
	case testFailed(err):
		return nil, false, fmt.Errorf("%w: job %s in namespace %s is not a runner Job of task %q; whoever may create Jobs in the namespace made it, and the task does not run as it", ErrJobTaken, j.Name, j.Namespace, j.Annotations[contract.TaskID])
	case err == nil:
		err = c.Patch(ctx, made, jsonPatch(append(proveOps(j.Annotations[contract.TaskID], made.UID), adoptOps(made, j.Labels[contract.LabelDispatcher], adopt)...)))
	}
	if err != nil {
		// Not %w: a patch refused as invalid must not read as the Job being
		// refused (IsPermanent); the Job exists.
		return nil, false, fmt.Errorf("adopting job %s: %v", j.Name, err) //nolint:errorlint // see above
	}
	return made, false, nil
}

// deleteJob deletes the Job j, made for a Secret that could not be made: it
// never ran. A Job gone, or replaced since (another UID), is not an error.
func deleteJob(ctx context.Context, c client.Client, j *batchv1.Job) error {
	err := c.Delete(ctx, j, client.Preconditions{UID: &j.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting job %s: %w", j.Name, err)
	}
	return nil
}

// resume lets a Job awaiting its Secret run, or, given its queue labels,
// join its Kueue queue, suspended until Kueue admits it.
func resume(ctx context.Context, c client.Client, j *batchv1.Job, queue map[string]any) error {
	p := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{AnnotationAwaitingSecret: nil}},
		"spec":     map[string]any{"suspend": false},
	}
	if len(queue) > 0 {
		p = map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationAwaitingSecret: nil}, "labels": queue}}
	}
	patch, _ := json.Marshal(p)
	if err := c.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("resuming job %s once its secret exists: %w", j.Name, err)
	}
	return nil
}

// secretGone waits up to limit for no Secret to hold s's name. The
// dispatcher may not read Secrets: a server-side dry run of creating s
// tells, and stores nothing.
func secretGone(ctx context.Context, c client.Client, s *corev1.Secret, limit time.Duration) (bool, error) {
	gone := false
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		err := c.Create(ctx, s.DeepCopy(), client.DryRunAll)
		switch {
		case err == nil:
			gone = true
			return true, nil
		case apierrors.IsAlreadyExists(err):
			return false, nil
		default:
			return false, fmt.Errorf("checking whether secret %s is gone: %w", s.Name, err)
		}
	})
	if gone || wait.Interrupted(err) {
		return gone, nil
	}
	return false, err
}

// jsonPatch is a JSON patch (RFC 6902) of these operations.
func jsonPatch(ops []map[string]any) client.Patch {
	b, _ := json.Marshal(ops)
	return client.RawPatch(types.JSONPatchType, b)
}

// proveOps are JSON patch operations that change nothing and fail
// (testFailed) unless the Job is a runner Job (contract.LabelRunner on its pods) of
// the task taskID, and, if uid is set, the Job of that UID.
func proveOps(taskID string, uid types.UID) []map[string]any {
	ops := []map[string]any{
		{"op": "test", "path": "/spec/template/metadata/labels/" + jsonPointer(contract.LabelRunner), "value": "true"},
		{"op": "test", "path": "/metadata/annotations/" + jsonPointer(contract.TaskID), "value": taskID},
	}
	if uid != "" {
		ops = append(ops, map[string]any{"op": "test", "path": "/metadata/uid", "value": uid})
	}
	return ops
}

// adoptOps are the JSON patch operations that give the Job j the
// dispatcher label of dispatcherID and the annotations (a nil value removes
// one that j has).
func adoptOps(j *batchv1.Job, dispatcherID string, annotations map[string]any) []map[string]any {
	ops := []map[string]any{{"op": "add", "path": "/metadata/labels/" + jsonPointer(contract.LabelDispatcher), "value": dispatcherID}}
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch v := annotations[k]; {
		case v != nil:
			ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/" + jsonPointer(k), "value": v})
		case j.Annotations[k] != "":
			ops = append(ops, map[string]any{"op": "remove", "path": "/metadata/annotations/" + jsonPointer(k)})
		}
	}
	return ops
}

// jsonPointer escapes a map key as one JSON pointer (RFC 6901) token.
func jsonPointer(key string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}

// testFailed tells whether a JSON patch failed one of its test operations:
// the API server answers 422 (a failed test, or a tested path that is not
// there). A patch of tests alone changes nothing, so nothing else of the
// object is validated.
func testFailed(err error) bool {
	var st apierrors.APIStatus
	return errors.As(err, &st) && st.Status().Code == http.StatusUnprocessableEntity
}

// IsRunnerJobOf tells whether j, read with its pod template, is a runner
// Job of the task taskID: the Job Build made for it, not one someone else
// made under its name.
func IsRunnerJobOf(j *batchv1.Job, taskID string) bool {
	return j.Spec.Template.Labels[contract.LabelRunner] == "true" && j.Annotations[contract.TaskID] == taskID
}

// IsRunnerJobFor tells whether j, read with its pod template, is the
// runner Job of task taskID (IsRunnerJobOf) that dispatcher dispatcherID
// holds (its label): a Job read past the dispatcher's cache, which holds
// only its own Jobs, is believed for the task only so.
func IsRunnerJobFor(j *batchv1.Job, taskID, dispatcherID string) bool {
	return dispatcherID != "" && j.Labels[contract.LabelDispatcher] == dispatcherID && IsRunnerJobOf(j, taskID)
}

// TakeOver gives a Job of one of this dispatcher's tasks, made under another
// dispatcher ID, dispatcherID's label, as Create does when it adopts one. j
// must be read with its pod template: a Job that is not the runner Job of
// the task taskID (IsRunnerJobOf) is someone else's, ErrJobTaken, and left
// as it is. A Job that is gone is not an error.
func TakeOver(ctx context.Context, c client.Client, j *batchv1.Job, taskID, dispatcherID string) error {
	if !IsRunnerJobOf(j, taskID) {
		return fmt.Errorf("%w: job %s in namespace %s is not a runner Job of task %q; whoever may create Jobs in the namespace made it", ErrJobTaken, j.Name, j.Namespace, taskID)
	}
	if err := c.Patch(ctx, j, jsonPatch(append(proveOps(taskID, j.UID), adoptOps(j, dispatcherID, nil)...))); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("labelling job %s: %w", j.Name, err)
	}
	return nil
}

// HasSecret reports whether a Job's task has a Secret of its own (marked
// by AnnotationSecret, as Build makes it). A Job made before Secrets took
// SecretPrefix names a Secret of the Job's own name: that counts too.
func HasSecret(j *batchv1.Job) bool {
	s := j.Annotations[AnnotationSecret]
	return s != "" && (s == SecretName(j.Name) || s == j.Name)
}

// MarkReported marks a finished Job reported (AnnotationReported) and gives
// it its TTL (o.TTLSecondsAfterFinished): the source holds the outcome, so
// the Job may go. A Job already gone is not an error.
//
// A non-zero keepUntil is written as AnnotationKeepUntil: PruneHistory
// leaves the Job until then.
func MarkReported(ctx context.Context, c client.Client, j *batchv1.Job, o Options, keepUntil time.Time) error {
	a := map[string]string{AnnotationReported: "true"}
	if !keepUntil.IsZero() {
		a[AnnotationKeepUntil] = keepUntil.UTC().Format(time.RFC3339)
	}
	return settle(ctx, c, j, o, a)
}

// GiveTTL gives a Job its TTL without marking it reported: a Job this
// dispatcher leaves to another holder of its task.
func GiveTTL(ctx context.Context, c client.Client, j *batchv1.Job, o Options) error {
	return settle(ctx, c, j, o, nil)
}

func settle(ctx context.Context, c client.Client, j *batchv1.Job, o Options, annotations map[string]string) error {
	o.setDefaults()
	p := map[string]any{"spec": map[string]any{"ttlSecondsAfterFinished": o.TTLSecondsAfterFinished}}
	if len(annotations) > 0 {
		p["metadata"] = map[string]any{"annotations": annotations}
	}
	patch, _ := json.Marshal(p)
	if err := c.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("settling job %s: %w", j.Name, err)
	}
	return nil
}

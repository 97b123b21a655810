package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
// either.
func IsPermanent(err error) bool {
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

// Create makes the task's Secret (if any) and Job as Build returned them.
// A Job that already exists (the task was started before a restart, or
// handed out twice) is adopted, never duplicated: it gets j's dispatcher
// label (a dispatcher whose ID changed, or another one the task was handed
// to, takes it over: its cache sees only Jobs of its own ID) and the
// annotations in adopt (a nil value removes one). Either way the Job then owns
// the Secret, so they go together. created tells whether this call made
// the Job. A Job the API server can never accept (IsPermanent) leaves no
// Secret behind.
func Create(ctx context.Context, c client.Client, j *batchv1.Job, secret *corev1.Secret, adopt map[string]any) (created bool, err error) {
	if secret != nil {
		if err := c.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, fmt.Errorf("creating secret %s: %w", secret.Name, err)
		}
	}
	made := j.DeepCopy()
	err = c.Create(ctx, made)
	switch {
	case err == nil:
		created = true
	case apierrors.IsAlreadyExists(err) || IsPermanent(err):
		// The API server validates before it looks for the name, so a Job
		// refused as invalid may still exist (created from an older pod
		// template): adopt it if so. Read it back from the API server (a
		// cache may not have it yet) through the patch, empty or not.
		cause := err
		made = &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Name: j.Name}}
		err := c.Patch(ctx, made, client.RawPatch(types.MergePatchType, adoptPatch(j.Labels[LabelDispatcher], adopt)))
		switch {
		case err == nil:
		case apierrors.IsNotFound(err) && IsPermanent(cause):
			// This Job will never be accepted: its Secret must not stay behind.
			if secret != nil {
				if derr := c.Delete(ctx, secret.DeepCopy()); client.IgnoreNotFound(derr) != nil {
					return false, fmt.Errorf("creating job %s: %w (and deleting its secret: %w)", j.Name, cause, derr)
				}
			}
			return false, fmt.Errorf("creating job %s: %w", j.Name, cause)
		default:
			// Not %w: a patch refused as invalid must not read as the
			// Job being refused (IsPermanent); the Job exists.
			return false, fmt.Errorf("adopting job %s: %v", j.Name, err) //nolint:errorlint // see above
		}
	default:
		return false, fmt.Errorf("creating job %s: %w", j.Name, err)
	}
	if secret == nil {
		return created, nil
	}
	return created, ownSecret(ctx, c, made)
}

// adoptPatch is the JSON merge patch that gives an existing Job the
// dispatcher label of dispatcherID and the annotations (a nil value removes
// one).
func adoptPatch(dispatcherID string, annotations map[string]any) []byte {
	meta := map[string]any{"labels": map[string]any{LabelDispatcher: dispatcherID}}
	if annotations != nil {
		meta["annotations"] = annotations
	}
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	return patch
}

// TakeOver gives a Job of one of this dispatcher's tasks, made under another
// dispatcher ID, dispatcherID's label, as Create does when it adopts one. A
// Job that is gone is not an error.
func TakeOver(ctx context.Context, c client.Client, j *batchv1.Job, dispatcherID string) error {
	if err := c.Patch(ctx, j, client.RawPatch(types.MergePatchType, adoptPatch(dispatcherID, nil))); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("labelling job %s: %w", j.Name, err)
	}
	return nil
}

// OwnSecret makes the Job named like j the owner of its task's Secret, if
// it has one: a Secret made just before the dispatcher stopped, without an
// owner, would otherwise stay when the Job goes. The Job is read from the
// API server first (through an empty patch): j may be an older Job of the
// same name, gone since, whose UID would hand the Secret to nothing. A Job
// or Secret that does not exist is not an error.
func OwnSecret(ctx context.Context, c client.Client, j *batchv1.Job) error {
	if !HasSecret(j) {
		return nil
	}
	now := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Name: j.Name}}
	if err := c.Patch(ctx, now, client.RawPatch(types.MergePatchType, []byte("{}"))); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !HasSecret(now) {
		return nil
	}
	return client.IgnoreNotFound(ownSecret(ctx, c, now))
}

// HasSecret reports whether a Job's task has a Secret of its own (marked
// by AnnotationSecret, as Build makes it).
func HasSecret(j *batchv1.Job) bool {
	return j.Annotations[AnnotationSecret] == j.Name
}

func ownSecret(ctx context.Context, c client.Client, j *batchv1.Job) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{{
		APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true),
	}}}})
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Name: j.Name}}
	if err := c.Patch(ctx, sec, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("making job %s own its secret: %w", j.Name, err)
	}
	return nil
}

// MarkReported marks a finished Job reported (AnnotationReported) and gives
// it its TTL (o.TTLSecondsAfterFinished): the source holds the outcome, so
// the Job may go. A Job already gone is not an error.
func MarkReported(ctx context.Context, c client.Client, j *batchv1.Job, o Options) error {
	return settle(ctx, c, j, o, true)
}

// GiveTTL gives a Job its TTL without marking it reported: a Job this
// dispatcher leaves to another holder of its task.
func GiveTTL(ctx context.Context, c client.Client, j *batchv1.Job, o Options) error {
	return settle(ctx, c, j, o, false)
}

func settle(ctx context.Context, c client.Client, j *batchv1.Job, o Options, reported bool) error {
	o.setDefaults()
	p := map[string]any{"spec": map[string]any{"ttlSecondsAfterFinished": o.TTLSecondsAfterFinished}}
	if reported {
		p["metadata"] = map[string]any{"annotations": map[string]string{AnnotationReported: "true"}}
	}
	patch, _ := json.Marshal(p)
	if err := c.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("settling job %s: %w", j.Name, err)
	}
	return nil
}

package job

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/runwarden/runwarden/internal/contract"
)

// statusError is an error as client-go returns it for an API server
// answer with this code and message.
func statusError(code int32, reason metav1.StatusReason, msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}}
}

func TestIsPermanent(t *testing.T) {
	t.Parallel()
	jobs := schema.GroupResource{Group: "batch", Resource: "jobs"}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: "batch", Kind: "Job"}, "rw-t-1", field.ErrorList{field.Invalid(field.NewPath("spec"), "x", "bad")}), true},
		{"bad request", apierrors.NewBadRequest("no"), true},
		{"webhook denial, 403 (controller-runtime, Gatekeeper)", statusError(http.StatusForbidden, metav1.StatusReasonForbidden,
			`admission webhook "validation.gatekeeper.sh" denied the request: [owner] missing label owner`), true},
		{"webhook denial without explanation, 400", statusError(http.StatusBadRequest, metav1.StatusReasonBadRequest,
			`admission webhook "jobs.example.com" denied the request without explanation`), true},
		{"webhook denial with a custom code", statusError(http.StatusConflict, metav1.StatusReasonConflict,
			`admission webhook "jobs.example.com" denied the request: not now`), true},
		{"validating admission policy, 403", statusError(http.StatusForbidden, metav1.StatusReasonForbidden,
			`jobs.batch "rw-t-1" is forbidden: ValidatingAdmissionPolicy 'job-limits' with binding 'job-limits' denied request: too big`), true},
		{"wrapped webhook denial", fmt.Errorf("creating job rw-t-1: %w", statusError(http.StatusForbidden, metav1.StatusReasonForbidden,
			`admission webhook "v.example.com" denied the request: no`)), true},
		{"RBAC refusal", apierrors.NewForbidden(jobs, "rw-t-1", errors.New(`User "system:serviceaccount:rw:dispatcher" cannot create resource "jobs"`)), false},
		{"quota exceeded", apierrors.NewForbidden(jobs, "rw-t-1", errors.New("exceeded quota: runners, requested: count/jobs.batch=1, used: count/jobs.batch=10, limited: count/jobs.batch=10")), false},
		{"namespace terminating", apierrors.NewForbidden(jobs, "rw-t-1", errors.New("unable to create new content in namespace runners because it is being terminated")), false},
		{"webhook unreachable", apierrors.NewInternalError(errors.New(`failed calling webhook "v.example.com": connection refused`)), false},
		{"a webhook's own 500 naming a denial", statusError(http.StatusInternalServerError, metav1.StatusReasonInternalError,
			`admission webhook "v.example.com" denied the request: policy engine crashed`), false},
		{"past the API server's request limit, 413", apierrors.NewRequestEntityTooLargeError("limit is 3145728"), true},
		{"past etcd's request limit", apierrors.NewInternalError(errors.New("etcdserver: request is too large")), true},
		{"already exists", apierrors.NewAlreadyExists(jobs, "rw-t-1"), false},
		{"timeout", apierrors.NewTimeoutError("slow", 1), false},
		{"not an API error", errors.New("connection reset"), false},
		{"nil", nil, false},
	} {
		if got := IsPermanent(c.err); got != c.want {
			t.Errorf("%s: IsPermanent(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A Job of the same task made under another dispatcher ID (the ID changed
// across a restart, or the task was handed to another dispatcher) is
// adopted, not duplicated, and takes this dispatcher's label, without
// which its cache would never show it; the adopt annotations are applied.
// It ran already, so its Secret was made then: none is made now.
func TestCreateAdoptsJobOfAnotherDispatcher(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	old := j.DeepCopy()
	old.Labels[contract.LabelDispatcher] = "dispatcher-old"
	old.Annotations["example.com/keep"] = "yes"
	c := fake.NewClientBuilder().WithObjects(old).Build()
	created, err := Create(t.Context(), c, j, secret, CreateOptions{Adopt: map[string]any{"example.com/lease": "2", "example.com/keep": "yes"}})
	if err != nil || created {
		t.Fatalf("Create over an existing Job: created %v, %v; want adopted", created, err)
	}
	var got batchv1.Job
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(j), &got); err != nil {
		t.Fatal(err)
	}
	if got.Labels[contract.LabelDispatcher] != "dispatcher-a" || got.Annotations["example.com/lease"] != "2" || got.Annotations["example.com/keep"] != "yes" {
		t.Fatalf("adopted Job: labels %v, annotations %v; want dispatcher-a's label and the lease annotation", got.Labels, got.Annotations)
	}
	var jobs batchv1.JobList
	if err := c.List(t.Context(), &jobs); err != nil || len(jobs.Items) != 1 {
		t.Fatalf("%d Jobs (%v), want 1", len(jobs.Items), err)
	}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(secret), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a Secret was made for a Job that ran before: %v", err)
	}
}

// A Job of the task's name that is not the task's runner Job was made by
// someone who may create Jobs in the runner namespace: adopting it would
// report its outcome as the task's, or make the task's Secret (its values)
// owned by it and resume it. It is never adopted: the task is refused
// (IsPermanent), naming the Job, and the Job is left as it was, with no
// Secret made.
func TestCreateNeverAdoptsAForeignJob(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		plant func(*batchv1.Job)
	}{
		{"pods not runners", func(j *batchv1.Job) { delete(j.Spec.Template.Labels, contract.LabelRunner) }},
		{"no pod labels at all", func(j *batchv1.Job) { j.Spec.Template.Labels = nil }},
		{"runner pods of another task", func(j *batchv1.Job) { j.Annotations[contract.TaskID] = "other-task" }},
		{"no task annotation", func(j *batchv1.Job) { delete(j.Annotations, contract.TaskID) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			j, secret, err := Build(task(), options(t))
			if err != nil {
				t.Fatal(err)
			}
			planted := j.DeepCopy()
			planted.Labels[contract.LabelDispatcher] = "someone"
			planted.Spec.Suspend = ptr.To(true)
			planted.Annotations[AnnotationAwaitingSecret] = "true"
			c.plant(planted)
			rec := &calls{}
			cl := withGC(t, rec, planted)
			created, err := Create(t.Context(), cl, j, secret, CreateOptions{Adopt: map[string]any{"example.com/lease": "2"}})
			if !errors.Is(err, ErrJobTaken) || !IsPermanent(err) || created {
				t.Fatalf("Create over a planted Job: created %v, %v; want ErrJobTaken", created, err)
			}
			if !strings.Contains(err.Error(), "job "+j.Name+" in namespace team-a is not a runner Job of task") {
				t.Errorf("message %q does not name the Job", err)
			}
			var got batchv1.Job
			if err := cl.Get(t.Context(), client.ObjectKeyFromObject(j), &got); err != nil {
				t.Fatal(err)
			}
			if got.Labels[contract.LabelDispatcher] != "someone" || got.Annotations["example.com/lease"] != "" || !*got.Spec.Suspend {
				t.Fatalf("the planted Job was changed: labels %v, annotations %v, suspend %v", got.Labels, got.Annotations, *got.Spec.Suspend)
			}
			if err := cl.Get(t.Context(), client.ObjectKeyFromObject(secret), &corev1.Secret{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the task's Secret was made for a planted Job: %v", err)
			}
		})
	}
}

func TestIsRunnerJobOf(t *testing.T) {
	t.Parallel()
	j, _, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	id := task().ID
	if !IsRunnerJobOf(j, id) {
		t.Fatal("the Job Build made is not the task's runner Job")
	}
	if IsRunnerJobOf(j, id+"x") {
		t.Error("a runner Job of another task passes")
	}
	j.Spec.Template.Labels[contract.LabelRunner] = "false"
	if IsRunnerJobOf(j, id) {
		t.Error("a Job whose pods are not runners passes")
	}
}

// calls records the writes a client sends, with the Job's suspension at
// the moment each Secret is made.
type calls struct {
	mu  sync.Mutex
	log []string
}

func (r *calls) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

// withGC is a fake client that records writes, answers a dry run and sets
// UIDs as the API server does, and, like the garbage collector, deletes the Secrets a
// deleted Job controlled.
func withGC(t *testing.T, rec *calls, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			o := &client.CreateOptions{}
			o.ApplyOptions(opts)
			if s, ok := obj.(*corev1.Secret); ok && len(o.DryRun) == 0 {
				var j batchv1.Job
				state := "no job"
				if err := c.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: strings.TrimPrefix(s.Name, SecretPrefix)}, &j); err == nil {
					state = fmt.Sprintf("job suspended=%v", j.Spec.Suspend != nil && *j.Spec.Suspend)
				}
				rec.add("create secret (" + state + ")")
			} else if len(o.DryRun) == 0 {
				rec.add(fmt.Sprintf("create %T", obj))
			}
			if len(o.DryRun) > 0 {
				// The fake client stores nothing on a dry run but does
				// not look for the name, as the API server does.
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)); err == nil {
					return apierrors.NewAlreadyExists(schema.GroupResource{Resource: "secrets"}, obj.GetName())
				}
			}
			if len(o.DryRun) == 0 && obj.GetUID() == "" {
				// The fake client sets no UID; the API server does.
				obj.SetUID(uuid.NewUUID())
			}
			return c.Create(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			rec.add(fmt.Sprintf("patch %T", obj))
			err := c.Patch(ctx, obj, patch, opts...)
			var st apierrors.APIStatus
			if err != nil && patch.Type() == types.JSONPatchType && !errors.As(err, &st) {
				// The fake client returns a JSON patch's failed test as is;
				// the API server answers 422 with its text.
				return statusError(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, err.Error())
			}
			return err
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			rec.add(fmt.Sprintf("delete %T", obj))
			if err := c.Delete(ctx, obj, opts...); err != nil {
				return err
			}
			var secrets corev1.SecretList
			if err := c.List(ctx, &secrets, client.InNamespace(obj.GetNamespace())); err != nil {
				return err
			}
			for i := range secrets.Items {
				if owner := metav1.GetControllerOf(&secrets.Items[i]); owner != nil && owner.UID == obj.GetUID() {
					if err := c.Delete(ctx, &secrets.Items[i]); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}).Build()
}

// secretOwner is the UID of the controller of the task's Secret.
func secretOwner(t *testing.T, c client.Client, secret *corev1.Secret) types.UID {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(secret), &s); err != nil {
		t.Fatalf("the task's Secret: %v", err)
	}
	owner := metav1.GetControllerOf(&s)
	if owner == nil || owner.Kind != "Job" || SecretName(owner.Name) != s.Name || len(s.OwnerReferences) != 1 {
		t.Fatalf("Secret owners %+v, want its Job alone", s.OwnerReferences)
	}
	return owner.UID
}

// The Secret is made with its owner set, while the Job is suspended; only
// then does the Job run. No write ever touches a Secret but its create.
func TestCreateOwnsSecretBeforeTheJobRuns(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	rec := &calls{}
	c := withGC(t, rec)
	created, err := Create(t.Context(), c, j, secret, CreateOptions{})
	if err != nil || !created {
		t.Fatalf("Create: created %v, %v", created, err)
	}
	want := []string{"create *v1.Job", "create secret (job suspended=true)", "patch *v1.Job"}
	if !slices.Equal(rec.log, want) {
		t.Fatalf("writes %q, want %q", rec.log, want)
	}
	var got batchv1.Job
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(j), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Suspend == nil || *got.Spec.Suspend || got.Annotations[AnnotationAwaitingSecret] != "" {
		t.Fatalf("Job suspend %v, annotations %v: not resumed", got.Spec.Suspend, got.Annotations)
	}
	if uid := secretOwner(t, c, secret); uid != got.UID || uid == "" {
		t.Fatalf("Secret owned by %s, want the Job %s", uid, got.UID)
	}
	if j.Spec.Suspend != nil || j.Annotations[AnnotationAwaitingSecret] != "" {
		t.Fatal("Create changed the Job it was given")
	}
}

// A Secret of the task's name that someone else made is never adopted:
// the Job made for it is deleted, and once the Secret outlasts the wait for
// the garbage collector the task is refused (IsPermanent) naming it. The
// Secret is left as it was.
func TestCreateNeverAdoptsASecret(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	planted := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name},
		StringData: map[string]string{"TF_VAR_token": "attacker-chosen"},
	}
	rec := &calls{}
	c := withGC(t, rec, planted)
	created, err := Create(t.Context(), c, j, secret, CreateOptions{SecretWait: 300 * time.Millisecond})
	if !errors.Is(err, ErrSecretTaken) || !IsPermanent(err) || created {
		t.Fatalf("Create with a planted Secret: created %v, %v; want ErrSecretTaken", created, err)
	}
	if !strings.Contains(err.Error(), "secret "+secret.Name+" in namespace team-a is not owned by the task's Job") {
		t.Errorf("message %q does not name the Secret", err)
	}
	var jobs batchv1.JobList
	if err := c.List(t.Context(), &jobs); err != nil || len(jobs.Items) != 0 {
		t.Fatalf("%d Jobs left (%v), want none", len(jobs.Items), err)
	}
	var s corev1.Secret
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(planted), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.OwnerReferences) != 0 || s.StringData["TF_VAR_token"] != "attacker-chosen" {
		t.Fatalf("the planted Secret was changed: owners %v, data %v", s.OwnerReferences, s.StringData)
	}
	if want := []string{"create *v1.Job", "create secret (job suspended=true)", "delete *v1.Job"}; !slices.Equal(rec.log, want) {
		t.Fatalf("writes %q, want %q", rec.log, want)
	}
}

// A start that stopped between making the Job and resuming it left a
// suspended Job, with or without its Secret. The next start finishes it:
// without the Secret, the Job is adopted and the Secret made; with it,
// the Job is deleted (its Secret goes with it) and both are made again.
func TestCreateFinishesAnInterruptedStart(t *testing.T) {
	t.Parallel()
	for _, withSecret := range []bool{false, true} {
		t.Run(fmt.Sprintf("secret made %v", withSecret), func(t *testing.T) {
			t.Parallel()
			j, secret, err := Build(task(), options(t))
			if err != nil {
				t.Fatal(err)
			}
			left := j.DeepCopy()
			left.UID = "first-start"
			left.Spec.Suspend = ptr.To(true)
			left.Annotations[AnnotationAwaitingSecret] = "true"
			objs := []client.Object{left}
			if withSecret {
				s := secret.DeepCopy()
				s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: left.UID, Controller: ptr.To(true)}}
				objs = append(objs, s)
			}
			rec := &calls{}
			c := withGC(t, rec, objs...)
			created, err := Create(t.Context(), c, j, secret, CreateOptions{SecretWait: 5 * time.Second})
			if err != nil || created != withSecret {
				t.Fatalf("Create: created %v, %v; want created %v", created, err, withSecret)
			}
			var got batchv1.Job
			if err := c.Get(t.Context(), client.ObjectKeyFromObject(j), &got); err != nil {
				t.Fatal(err)
			}
			if got.Spec.Suspend == nil || *got.Spec.Suspend || got.Annotations[AnnotationAwaitingSecret] != "" {
				t.Fatalf("Job suspend %v, annotations %v: not resumed", got.Spec.Suspend, got.Annotations)
			}
			if (got.UID == left.UID) == withSecret {
				t.Fatalf("Job UID %s, first start's %s", got.UID, left.UID)
			}
			if uid := secretOwner(t, c, secret); uid != got.UID || uid == "" {
				t.Fatalf("Secret owned by %s, want the Job %s", uid, got.UID)
			}
			// Two patches adopt the Job: one proves it is the task's, one adopts it.
			want := []string{"create *v1.Job", "patch *v1.Job", "patch *v1.Job", "create secret (job suspended=true)", "patch *v1.Job"}
			if withSecret {
				want = []string{"create *v1.Job", "patch *v1.Job", "patch *v1.Job", "create secret (job suspended=true)", "delete *v1.Job",
					"create *v1.Job", "create secret (job suspended=true)", "patch *v1.Job"}
			}
			if !slices.Equal(rec.log, want) {
				t.Fatalf("writes %q, want %q", rec.log, want)
			}
		})
	}
}

// A Job the API server refuses for good leaves no Secret: the Secret is
// made only once the Job exists.
func TestCreateRefusedJobLeavesNoSecret(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*batchv1.Job); ok {
				return apierrors.NewInvalid(schema.GroupKind{Group: "batch", Kind: "Job"}, obj.GetName(), field.ErrorList{field.Invalid(field.NewPath("spec"), "x", "bad")})
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	if _, err := Create(t.Context(), c, j, secret, CreateOptions{}); !IsPermanent(err) {
		t.Fatalf("Create of an invalid Job: %v, want a permanent error", err)
	}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(secret), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused Job's Secret: %v, want none", err)
	}
}

// A Secret the API server can never store (past its size limit) ends the
// task (IsPermanent) and leaves neither the Secret nor the Job made for it.
func TestCreateRefusedSecretLeavesNoJob(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				return apierrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, obj.GetName(), field.ErrorList{field.TooLong(field.NewPath("data"), "", 1<<20)})
			}
			obj.SetUID(uuid.NewUUID())
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	if _, err := Create(t.Context(), c, j, secret, CreateOptions{}); !IsPermanent(err) {
		t.Fatalf("Create with a Secret past the limit: %v, want a permanent error", err)
	}
	var jobs batchv1.JobList
	if err := c.List(t.Context(), &jobs); err != nil || len(jobs.Items) != 0 {
		t.Fatalf("%d Jobs left (%v), want none", len(jobs.Items), err)
	}
}

// A Job that an earlier dispatcher made awaiting its Secret, named then
// like the Job, is never resumed: the chart's admission policy lets no
// Secret of that name be made, nor would the Job read the one made now.
// It is deleted, and the call fails so that the next one starts the task
// anew; a Secret that a Job of the earlier version already runs with is
// its own, and such a Job still counts as having one (HasSecret).
func TestCreateDeletesAJobAwaitingAnEarlierSecretName(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	left := j.DeepCopy()
	left.UID = "earlier-version"
	left.Spec.Suspend = ptr.To(true)
	left.Annotations[AnnotationAwaitingSecret] = "true"
	left.Annotations[AnnotationSecret] = j.Name
	if !HasSecret(left) {
		t.Errorf("HasSecret of a Job whose Secret is named like it (an earlier version's): false")
	}
	rec := &calls{}
	c := withGC(t, rec, left)
	created, err := Create(t.Context(), c, j, secret, CreateOptions{SecretWait: time.Second})
	if err == nil || created || IsPermanent(err) {
		t.Fatalf("Create over an earlier version's Job: created %v, %v; want a passing error", created, err)
	}
	for _, w := range []string{"job " + j.Name + " awaited secret " + j.Name + ", not " + SecretName(j.Name), "the task starts again"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(j), &batchv1.Job{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the earlier version's Job: %v, want it deleted", err)
	}
	want := []string{"create *v1.Job", "patch *v1.Job", "patch *v1.Job", "delete *v1.Job"}
	if !slices.Equal(rec.log, want) {
		t.Fatalf("writes %q, want %q", rec.log, want)
	}
	if created, err := Create(t.Context(), c, j, secret, CreateOptions{SecretWait: time.Second}); err != nil || !created {
		t.Fatalf("the next Create: created %v, %v", created, err)
	}
	if uid := secretOwner(t, c, secret); uid == "" || uid == left.UID {
		t.Fatalf("Secret owned by %q, want the new Job", uid)
	}
}

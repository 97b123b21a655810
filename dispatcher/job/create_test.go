package job

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
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
func TestCreateAdoptsJobOfAnotherDispatcher(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	old := j.DeepCopy()
	old.Labels[LabelDispatcher] = "dispatcher-old"
	old.Annotations["example.com/keep"] = "yes"
	c := fake.NewClientBuilder().WithObjects(old).Build()
	created, err := Create(t.Context(), c, j, secret, map[string]any{"example.com/lease": "2", "example.com/keep": "yes"})
	if err != nil || created {
		t.Fatalf("Create over an existing Job: created %v, %v; want adopted", created, err)
	}
	var got batchv1.Job
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(j), &got); err != nil {
		t.Fatal(err)
	}
	if got.Labels[LabelDispatcher] != "dispatcher-a" || got.Annotations["example.com/lease"] != "2" || got.Annotations["example.com/keep"] != "yes" {
		t.Fatalf("adopted Job: labels %v, annotations %v; want dispatcher-a's label and the lease annotation", got.Labels, got.Annotations)
	}
	var jobs batchv1.JobList
	if err := c.List(t.Context(), &jobs); err != nil || len(jobs.Items) != 1 {
		t.Fatalf("%d Jobs (%v), want 1", len(jobs.Items), err)
	}
	var s corev1.Secret
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(secret), &s); err != nil {
		t.Fatal(err)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Name != j.Name {
		t.Fatalf("secret owners %v, want the Job", s.OwnerReferences)
	}
}

package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// A refused preflight Job names the cause the API server gave: RBAC, quota
// or an admission webhook on Jobs.
func TestPreflightNamesWhyTheJobWasRefused(t *testing.T) {
	t.Parallel()
	jobs := schema.GroupResource{Group: "batch", Resource: "jobs"}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"rbac", apierrors.NewForbidden(jobs, "", errors.New(`User "system:serviceaccount:rw:dispatcher" cannot create resource "jobs"`)), "may not create Jobs in runners (RBAC)"},
		{"quota", apierrors.NewForbidden(jobs, "rw-x", errors.New("exceeded quota: jobs, requested: count/jobs.batch=1, used: count/jobs.batch=5, limited: count/jobs.batch=5")), "over a ResourceQuota in runners"},
		{"webhook", apierrors.NewForbidden(jobs, "rw-x", errors.New(`admission webhook "jobs.policy.example" denied the request: no`)), "not admitted in runners (an admission webhook or policy on Jobs)"},
		{"policy", apierrors.NewForbidden(jobs, "rw-x", errors.New(`ValidatingAdmissionPolicy 'no-jobs' with binding 'no-jobs' denied request: no`)), "not admitted in runners"},
		{"other", apierrors.NewServiceUnavailable("down"), "creating a Job in runners"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := createRefused("runners", tt.err)
			if !errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// EnvFiles tells a cluster that keeps fileKeyRef from one whose API server
// drops it (the gate off) or refuses it, and stores nothing either way.
func TestEnvFilesProbe(t *testing.T) {
	t.Parallel()
	opts := job.Options{DispatcherID: "d-1", Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "runner:1"}}}}}
	drop := func(ctx context.Context, c client.WithWatch, obj client.Object, o ...client.CreateOption) error {
		j := obj.(*batchv1.Job)
		for i := range j.Spec.Template.Spec.Containers {
			for k := range j.Spec.Template.Spec.Containers[i].Env {
				if e := &j.Spec.Template.Spec.Containers[i].Env[k]; e.ValueFrom != nil && e.ValueFrom.FileKeyRef != nil {
					e.ValueFrom = nil
				}
			}
		}
		return c.Create(ctx, obj, o...)
	}
	refuse := func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
		return apierrors.NewInvalid(schema.GroupKind{Group: "batch", Kind: "Job"}, "x", field.ErrorList{
			field.Required(field.NewPath("spec", "template", "spec", "containers").Index(0).Child("env").Index(0).Child("valueFrom"), "must specify one of"),
		})
	}
	for _, c := range []struct {
		name   string
		create func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error
		want   error
	}{
		{"kept", nil, nil},
		{"dropped", drop, ErrNoEnvFiles},
		{"refused", refuse, ErrNoEnvFiles},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := fake.NewClientBuilder()
			if c.create != nil {
				b = b.WithInterceptorFuncs(interceptor.Funcs{Create: c.create})
			}
			cl := b.Build()
			err := EnvFiles(t.Context(), Options{Client: cl, Jobs: opts, Namespace: "runners"})
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Fatalf("EnvFiles: %v, want %v", err, c.want)
			}
			var jobs batchv1.JobList
			if err := cl.List(t.Context(), &jobs); err != nil || len(jobs.Items) != 0 {
				t.Errorf("%d Jobs stored (%v): the probe is a dry run", len(jobs.Items), err)
			}
		})
	}
}

// With Kueue, the preflight checks that the default LocalQueue exists, and
// says which is missing; without a default, that LocalQueues can be read.
func TestPreflightChecksTheDefaultQueue(t *testing.T) {
	t.Parallel()
	gvk := job.WorkloadGVK.GroupVersion().WithKind("LocalQueue")
	s := runtime.NewScheme()
	s.AddKnownTypeWithName(gvk, &unstructured.Unstructured{})
	s.AddKnownTypeWithName(gvk.GroupVersion().WithKind("LocalQueueList"), &unstructured.UnstructuredList{})
	lq := &unstructured.Unstructured{}
	lq.SetGroupVersionKind(gvk)
	lq.SetNamespace("runners")
	lq.SetName("team-a")
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(lq).Build()
	for _, tc := range []struct {
		name, queue, want string
	}{
		{"exists", "team-a", ""},
		{"no default", "", ""},
		{"missing", "team-b", "--default-queue team-b: no LocalQueue team-b in runners"},
	} {
		err := checkQueue(t.Context(), c, "runners", tc.queue)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// Kueue not installed: the API server knows none of its kinds.
	noKueue := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return &meta.NoKindMatchError{GroupKind: gvk.GroupKind(), SearchedVersions: []string{gvk.Version}}
		},
	}).Build()
	err := checkQueue(t.Context(), noKueue, "runners", "team-a")
	if !errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), "is Kueue installed") {
		t.Errorf("without Kueue: %v", err)
	}
}

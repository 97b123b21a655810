package kube

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
			if !errors.Is(err, ErrPreflight) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want it to say %q", err, tt.want)
			}
		})
	}
}

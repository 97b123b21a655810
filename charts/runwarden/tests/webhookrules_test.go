package tests

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// TestValidatingWebhookRules: the validating webhook is sent every way to
// change a pod's spec (the pod, pods/ephemeralcontainers, pods/resize) and
// every way into one; its match condition skips the Job controller's own
// finalizer updates only, the Job controller named by
// webhook.jobControllerUsers, so that anyone else's addition or removal of
// batch.kubernetes.io/job-tracking is decided.
func TestValidatingWebhookRules(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	tests := []struct {
		name  string
		args  []string
		users string
	}{
		{name: "default", users: `["system:serviceaccount:kube-system:job-controller","system:kube-controller-manager"]`},
		{name: "another Job controller", args: []string{"--set", "webhook.jobControllerUsers={system:serviceaccount:kube-system:jobs}"},
			users: `["system:serviceaccount:kube-system:jobs"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var vwc admissionregistrationv1.ValidatingWebhookConfiguration
			decode(t, render(t, h, tt.args...), "ValidatingWebhookConfiguration/rw-runwarden", &vwc)
			if len(vwc.Webhooks) != 1 {
				t.Fatalf("%d webhooks, want 1", len(vwc.Webhooks))
			}
			w := vwc.Webhooks[0]
			got := map[string][]string{}
			for _, r := range w.Rules {
				for _, op := range r.Operations {
					got[string(op)] = append(got[string(op)], r.Resources...)
				}
			}
			want := map[string][]string{
				"CREATE":  {"pods", "pods/ephemeralcontainers", "pods/resize"},
				"UPDATE":  {"pods", "pods/ephemeralcontainers", "pods/resize"},
				"CONNECT": {"pods/exec", "pods/attach", "pods/portforward"},
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rules by operation (-want +got):\n%s", diff)
			}
			i := slices.IndexFunc(w.MatchConditions, func(c admissionregistrationv1.MatchCondition) bool { return c.Name == "changes-what-is-checked" })
			if i < 0 {
				t.Fatalf("no match condition changes-what-is-checked: %+v", w.MatchConditions)
			}
			expr := w.MatchConditions[i].Expression
			for _, part := range []string{"request.userInfo.username in " + tt.users, "'batch.kubernetes.io/job-tracking' in object.metadata.finalizers"} {
				if !strings.Contains(expr, part) {
					t.Errorf("the match condition does not hold %s:\n%s", part, expr)
				}
			}
		})
	}
}

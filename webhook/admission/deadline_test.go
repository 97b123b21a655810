package admission

import (
	"net/http"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/webhook/policy"
)

// A decision past the deadline is an error (HTTP 500 through Undecided, a
// call the API server retries), never a denial, and it ends at the deadline.
func TestHandlerFailsADecisionPastTheDeadline(t *testing.T) {
	t.Parallel()
	// Decided at once on the load's probe pod; for a pod of a platform that
	// sets slow, only after 10^10 steps.
	slow := `package runwarden.admission

decision := {"deny": [], "warnings": [], "mutations": {}} if not input.config.slow

decision := {"deny": [], "warnings": [sprintf("%d", [n])], "mutations": {}} if {
	input.config.slow
	n := count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)])
}
`
	set, err := policy.Load(t.Context(), fstest.MapFS{"a.rego": {Data: []byte(slow)}}, "slow", policy.Options{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a"}}, taskJob()).Build()
	h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: map[string]any{"slow": true}, Mutate: true})
	resp := h.Handle(t.Context(), request(t, runnerPod("registry.example.com/runner:1")))
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, "ran past its deadline") {
		t.Errorf("answer for a decision past the deadline: allowed %v, result %+v; want an HTTP 500 error naming the deadline", resp.Allowed, resp.Result)
	}
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// quotingRule is a platform's rule that quotes a runner's env values, as
// written, %q-quoted and by %v of the container, in a violation (in dryrun:
// the pod is admitted, the webhook logs it, the report fails it) and in a
// warning (shown to the user, recorded on the pod).
const quotingRule = `package runwarden.admission

violations contains violation("quote-env", c.name, sprintf("env %s", [e.name]), sprintf("value %s, quoted %q, in %v", [e.value, e.value, c])) if {
	some c in input.pod.spec.containers
	some e in object.get(c, "env", [])
	e.name == "API_TOKEN"
}

warning contains sprintf("API_TOKEN is %s", [e.value]) if {
	some c in input.pod.spec.containers
	some e in object.get(c, "env", [])
	e.name == "API_TOKEN"
}
`

// TestReportsHoldNoSecret runs, on the real API server, a runner pod whose
// env holds a secret through a rule that quotes it, and checks that the
// secret reaches neither the PolicyReport the webhook writes, nor its log
// (the dryrun line), nor the warnings recorded on the pod; the rule's
// result is there, naming the rule, the container and the field.
func TestReportsHoldNoSecret(t *testing.T) {
	t.Parallel()
	const secret = "e2e-Zt8kW3nQ5xR1vB7m-token"
	f := features.New("secrets quoted by a rule").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: ns}}
			if err := cfg.Client().Resources().Create(ctx, sa); err != nil {
				t.Fatal(err)
			}
			installReportObjects(ctx, t, cfg)
			return ctx
		}).
		Assess("the report, the log and the record hold the rule, not the value", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			dir := filepath.Join(t.TempDir(), "policies")
			if err := os.CopyFS(dir, os.DirFS(filepath.Join(suite.RepoRoot, "policies"))); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(dir, "embed.go")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "quoting.rego"), []byte(quotingRule), 0o644); err != nil {
				t.Fatal(err)
			}
			// The last --policies wins: the shipped set and the quoting rule.
			w := startWebhookWith(ctx, t, cfg, webhookPlatformConfig+"enforcement:\n  rules:\n    quote-env: dryrun\n",
				"--runner-namespace", ns, "--pod-name", "webhook-e2e", "--pod-namespace", ns,
				"--policy-reports", "--policy-report-interval", "1s", "--policies", dir)

			j := runnerJobFor(ns, "quoted", false)
			c := &j.Spec.Template.Spec.Containers[0]
			c.Env = append(c.Env, corev1.EnvVar{Name: "API_TOKEN", Value: secret})
			pod, failure := jobPod(ctx, t, cfg, j)
			if pod == nil {
				t.Fatalf("no pod: %s\nwebhook log:\n%s", failure, w.log.String())
			}
			if rec := pod.Annotations["runwarden.dev/warnings"]; strings.Contains(rec, secret) || !strings.Contains(rec, "API_TOKEN is [redacted]") {
				t.Errorf("the pod's recorded warnings %q: want the warning, its value redacted", rec)
			}

			report := &unstructured.Unstructured{}
			var lastErr error
			listed := func(ctx context.Context) (bool, error) {
				report.SetGroupVersionKind(policyReportGVK)
				lastErr = cfg.Client().Resources().GetControllerRuntimeClient().Get(ctx, client.ObjectKey{Namespace: ns, Name: "runwarden"}, report)
				return lastErr == nil && slices.Contains(reportPods(report), pod.Name), nil
			}
			if err := harness.WaitFor(ctx, "a PolicyReport listing the pod", 90*time.Second, listed); err != nil {
				t.Fatalf("%v (last: %v)\nwebhook log:\n%s", err, lastErr, w.log.String())
			}
			raw, err := json.Marshal(report.Object)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(raw), secret) || strings.Contains(string(raw), "Zt8kW3nQ") {
				t.Errorf("the PolicyReport holds the secret:\n%s", raw)
			}
			results, _, _ := unstructured.NestedSlice(report.Object, "results")
			failed := false
			for _, r := range results {
				m, _ := r.(map[string]any)
				if m["rule"] == "quote-env" && m["result"] == "fail" && strings.Contains(m["message"].(string), "[redacted]") {
					failed = true
				}
			}
			if !failed {
				t.Errorf("the report has no failed quote-env result with its value redacted:\n%s", raw)
			}
			// The dryrun line was logged as the pod was admitted, before
			// the pod existed; the report came after.
			logged := w.log.String()
			if !strings.Contains(logged, "policy violation in dryrun") || !strings.Contains(logged, "quote-env") {
				t.Errorf("the webhook logged no dryrun line for quote-env:\n%s", logged)
			}
			if strings.Contains(logged, secret) || strings.Contains(logged, "Zt8kW3nQ") {
				t.Errorf("the webhook's log holds the secret:\n%s", logged)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

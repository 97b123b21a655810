package tests

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/webhook/policy"
)

// TestEnforcementReachesTheWebhook renders the chart with the platform's
// enforcement and checks the platform configuration the webhook reads: the
// mode from auditMode, the enforcement as written, accepted by the check
// the webhook makes at start; and the action the chart's own copy of the
// policies then gives a privileged runner pod in the runner namespace and
// in another.
func TestEnforcementReachesTheWebhook(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	set, err := policy.Load(t.Context(), os.DirFS("../policies"), "chart", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		values      string
		mode        string
		enforcement map[string]any
		// The action of no-privileged in the runner namespace, and in another.
		runners, other string
	}{
		{name: "defaults", mode: "enforce", runners: "deny", other: "deny"},
		{name: "audit mode", values: "webhook: {auditMode: true}", mode: "audit", runners: "warn", other: "warn"},
		{
			name: "per rule and per namespace",
			values: `webhook:
  platform:
    enforcement:
      default: warn
      rules: {no-privileged: dryrun, resources-required: dryrun}
      namespaces:
        runwarden-runners: {no-privileged: deny}
`,
			mode: "enforce",
			enforcement: map[string]any{
				"default":    "warn",
				"rules":      map[string]any{"no-privileged": "dryrun", "resources-required": "dryrun"},
				"namespaces": map[string]any{"runwarden-runners": map[string]any{"no-privileged": "deny"}},
			},
			runners: "deny", other: "dryrun",
		},
		{
			name:        "a default with auditMode off",
			values:      "webhook: {platform: {enforcement: {default: dryrun}}}",
			mode:        "enforce",
			enforcement: map[string]any{"default": "dryrun"},
			runners:     "dryrun", other: "dryrun",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte(tt.values), 0o644); err != nil {
				t.Fatal(err)
			}
			var cm corev1.ConfigMap
			decode(t, render(t, h, "-f", values), "ConfigMap/rw-runwarden-platform", &cm)
			cfg := map[string]any{}
			if err := yaml.Unmarshal([]byte(cm.Data["platform.yaml"]), &cfg); err != nil {
				t.Fatal(err)
			}
			if cfg["mode"] != tt.mode {
				t.Errorf("mode %v, want %s", cfg["mode"], tt.mode)
			}
			if diff := cmp.Diff(tt.enforcement, cfg["enforcement"]); tt.enforcement != nil && diff != "" {
				t.Errorf("enforcement (-want +got):\n%s", diff)
			}
			if _, ok := cfg["enforcement"]; tt.enforcement == nil && ok {
				t.Errorf("enforcement %v rendered, want none", cfg["enforcement"])
			}
			if err := policy.CheckEnforcement(cfg); err != nil {
				t.Errorf("the webhook refuses the rendered configuration: %v", err)
			}
			for ns, want := range map[string]string{"runwarden-runners": tt.runners, "team-b": tt.other} {
				if got := privilegedAction(t, set, cfg, ns); got != want {
					t.Errorf("no-privileged in %s: action %q, want %q", ns, got, want)
				}
			}
		})
	}
}

// privilegedAction is the action of the one violation the policies find on
// a privileged runner pod in namespace ns.
func privilegedAction(t *testing.T, set *policy.Set, cfg map[string]any, ns string) string {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "task-1", Namespace: ns, Labels: map[string]string{"runwarden.dev/runner": "true"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "runner",
			SecurityContext: &corev1.SecurityContext{Privileged: new(true)}}}},
	}
	d, err := set.Eval(t.Context(), &policy.Input{
		Operation: "CREATE", Runner: true, Pod: pod, Config: cfg,
		Namespace: policy.NamespaceInfo{Name: ns}, SecretRefs: []policy.SecretRef{},
	})
	if err != nil {
		t.Fatal(err)
	}
	vs := d.Violations()
	if len(vs) != 1 || vs[0].Rule != "no-privileged" {
		t.Fatalf("violations %+v, want no-privileged alone", vs)
	}
	return vs[0].Action
}

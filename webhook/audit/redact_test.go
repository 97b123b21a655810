package audit

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/webhook/policy"
)

// TestReportHoldsNoValue builds the PolicyReport of a pod holding a secret
// in each field a rule may quote, under a set whose every rule quotes
// them (../policy/testdata/quoting), each rule in deny, warn and dryrun,
// and checks that no secret reaches the report (its messages, its rule
// names) while each result still names its rule.
func TestReportHoldsNoValue(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), os.DirFS("../policy/testdata/quoting"), "quoting", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../policy/testdata/quoting/pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(b, pod); err != nil {
		t.Fatal(err)
	}
	s, err := os.ReadFile("../policy/testdata/quoting/secrets.txt")
	if err != nil {
		t.Fatal(err)
	}
	secrets := strings.Fields(string(s))
	for _, list := range []string{"deny", "warn", "dryrun"} {
		t.Run(list, func(t *testing.T) {
			t.Parallel()
			ev := NewEvaluator(Options{Set: set, Config: map[string]any{"list": list}, Lookups: clusterOf{}})
			sub := Subject{Ref: Ref{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name}, Source: SourceAdmittedPod, Pod: pod.DeepCopy()}
			o, err := ev.Evaluate(t.Context(), sub)
			if err != nil {
				t.Fatal(err)
			}
			r := BuildReport(pod.Namespace, []Evaluated{{Subject: sub, Outcome: o}}, ReportOptions{Set: set, Rules: ev.Rules(), Now: t0})
			text, _ := json.Marshal(r)
			if !strings.Contains(string(text), "[redacted]") {
				t.Fatalf("the report holds none of the set's quotes: %s", text)
			}
			for _, sec := range secrets {
				n := min(8, len(sec))
				for i := 0; i+n <= len(sec); i++ {
					if strings.Contains(string(text), sec[i:i+n]) {
						t.Errorf("the report holds the secret %q:\n%s", sec, text)
						break
					}
				}
			}
		})
	}
}

package admission

import (
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/webhook/policy"
)

// labelsSeen records the metric labels a handler counts with.
type labelsSeen struct {
	mu sync.Mutex
	l  []string
}

func (r *labelsSeen) Admission(result string, _ time.Duration) { r.add(result) }
func (r *labelsSeen) Violation(rule, action string)            { r.add(rule, action) }
func (r *labelsSeen) Decision(src policy.Source)               { r.add(string(src)) }

func (r *labelsSeen) add(l ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.l = append(r.l, l...)
}

func (r *labelsSeen) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.l...)
}

// TestNoValueLeavesTheWebhook admits, with a set whose every rule quotes
// what the pod carries (../policy/testdata/quoting: raw, %v of the
// containing object, %q, json.marshal, a substring, URL-encoded, in the
// rule's name and field too), a pod holding a secret in each field a rule
// may quote (each env value, argument, command word, probe command,
// annotation and label, the repository URL's userinfo), each rule in deny,
// warn and dryrun, through both handlers; and checks that no secret
// reaches what outlives the request: the denial (which the Job controller
// copies into a FailedCreate event, and the dispatcher into the task's
// failure), the warnings, the record annotation of the patch, any log
// line (every verbosity), or a metric label. Without the redaction in
// policy.Set.Eval every one of them leaks.
func TestNoValueLeavesTheWebhook(t *testing.T) {
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
		for _, mutate := range []bool{true, false} {
			name := list + "/validating"
			if mutate {
				name = list + "/mutating"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				reader := fake.NewClientBuilder().WithObjects(handlerObjects()...).Build()
				rec := &labelsSeen{}
				h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: map[string]any{"list": list}, Mutate: mutate, Recorder: rec})
				var logs lines
				ctx := log.IntoContext(t.Context(), funcr.New(logs.add, funcr.Options{Verbosity: 10}))
				resp := h.Handle(ctx, request(t, pod))

				out := map[string]string{"log": strings.Join(logs.all(), "\n"), "metric labels": strings.Join(rec.all(), "\n"), "warnings": strings.Join(resp.Warnings, "\n")}
				if resp.Result != nil {
					out["denial"] = resp.Result.Message
				}
				patch, _ := json.Marshal(resp.Patches)
				out["patch"] = string(patch)
				for what, text := range out {
					if l := leaked(text, secrets); len(l) > 0 {
						t.Errorf("the %s holds the secrets %q:\n%s", what, l, text)
					}
				}
				switch {
				case list == "deny" && (resp.Allowed || !strings.Contains(out["denial"], "raw [redacted]")):
					t.Errorf("allowed %v, denial %q; want a denial with the quotes redacted", resp.Allowed, out["denial"])
				case list == "warn" && len(resp.Warnings) < 20:
					t.Errorf("warnings %q, want the set's quotes", resp.Warnings)
				case list == "dryrun" && !mutate && !strings.Contains(out["log"], "policy violation in dryrun"):
					t.Errorf("no dryrun log line:\n%s", out["log"])
				case mutate && list != "deny" && !strings.Contains(out["patch"], strings.ReplaceAll(contract.AnnotationWarnings, "/", "~1")):
					t.Errorf("the patch records no warnings: %s", out["patch"])
				}
			})
		}
	}
}

// leaked names each secret of which text holds 8 bytes in a row (all of a
// shorter one).
func leaked(text string, secrets []string) []string {
	var out []string
	for _, s := range secrets {
		n := min(8, len(s))
		for i := 0; i+n <= len(s); i++ {
			if strings.Contains(text, s[i:i+n]) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

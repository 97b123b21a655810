package admission

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

var update = flag.Bool("update", false, "rewrite testdata/identity/*.golden.yaml")

// identityCase is one case of testdata/identity: the platform
// configuration, the service account's annotations and the pod as the API
// server hands it to the webhook.
type identityCase struct {
	Config         map[string]any    `json:"config"`
	ServiceAccount map[string]string `json:"serviceAccount"`
	Pod            corev1.Pod        `json:"pod"`
}

// identityResult is what a case's golden file holds: the pod as the shipped
// policies leave it, or why they refuse it.
type identityResult struct {
	Deny []string    `json:"deny,omitempty"`
	Pod  *corev1.Pod `json:"pod,omitempty"`
}

// The workload identity cases of the EKS pod identity webhook and the Azure
// Workload Identity webhook, written from their documented behaviour, and
// GKE's contract, through the shipped policies and Apply: each pod comes out
// as that cloud's webhook would leave it (for the runner containers).
func TestWorkloadIdentityGolden(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cases, err := filepath.Glob("testdata/identity/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, file := range cases {
		if strings.HasSuffix(file, ".golden.yaml") {
			continue
		}
		n++
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			t.Parallel()
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var c identityCase
			if err := yaml.UnmarshalStrict(raw, &c); err != nil {
				t.Fatal(err)
			}
			pod := c.Pod.DeepCopy()
			pod.Namespace = "team-a"
			if pod.Spec.ServiceAccountName == "" {
				pod.Spec.ServiceAccountName = "default"
			}
			d, err := set.Eval(t.Context(), &policy.Input{
				Operation: "CREATE", Pod: pod, Runner: true,
				Namespace:      policy.NamespaceInfo{Name: "team-a"},
				ServiceAccount: policy.ObjectInfo{Name: pod.Spec.ServiceAccountName, Annotations: c.ServiceAccount},
				Config:         c.Config,
			})
			if err != nil {
				t.Fatal(err)
			}
			var got identityResult
			for _, v := range d.Deny {
				got.Deny = append(got.Deny, v.Message)
			}
			if len(got.Deny) == 0 {
				Apply(pod, d.Mutations)
				again := pod.DeepCopy()
				Apply(again, d.Mutations)
				if diff := cmp.Diff(pod, again); diff != "" {
					t.Errorf("applying the mutations twice changes the pod (-once +twice):\n%s", diff)
				}
				got.Pod = pod
			}
			out, err := yaml.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(file, ".yaml") + ".golden.yaml"
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to write it)", err)
			}
			if diff := cmp.Diff(string(want), string(out)); diff != "" {
				t.Errorf("%s differs (-want +got):\n%s", golden, diff)
			}
		})
	}
	if n < 8 {
		t.Fatalf("%d cases in testdata/identity, want at least 8", n)
	}
}

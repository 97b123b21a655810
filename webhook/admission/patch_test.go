package admission

import (
	"encoding/json"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/webhook/policy"
)

// TestPatchKeepsFieldsTheWebhookDoesNotKnow checks that the patch leaves
// alone what the webhook's API types cannot decode (fields of a Kubernetes
// newer than the webhook): the pod's own volumes, variables and affinity
// keep them after the webhook adds its own.
func TestPatchKeepsFieldsTheWebhookDoesNotKnow(t *testing.T) {
	t.Parallel()
	raw, err := yaml.YAMLToJSON([]byte(`
apiVersion: v1
kind: Pod
metadata:
  name: runner
  labels: {app: runner, futureLabelPolicy: x}
spec:
  futurePodField: {a: 1}
  tolerations:
  - {key: a, operator: Exists, futureTolerationField: 1}
  affinity:
    futureAffinity: {b: 2}
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: zone, operator: In, values: [a]}
          futureTermField: 3
  volumes:
  - name: work
    futureVolumeSource: {size: 1}
  containers:
  - name: main
    image: runner
    futureContainerField: true
    env:
    - {name: KEEP, value: "1", futureEnvField: kept}
    - {name: CHANGE, value: old}
`))
	if err != nil {
		t.Fatal(err)
	}
	before := &corev1.Pod{}
	if err := json.Unmarshal(raw, before); err != nil {
		t.Fatal(err)
	}
	after := before.DeepCopy()
	Apply(after, policy.Mutations{
		Labels:       map[string]string{"runwarden.dev/injected": "true"},
		Tolerations:  []corev1.Toleration{{Key: "pool", Operator: corev1.TolerationOpExists}},
		NodeAffinity: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"runners"}}},
		Volumes:      []corev1.Volume{{Name: "vault-token", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		Env: []policy.ContainerEnv{
			{Containers: []string{"*"}, Env: corev1.EnvVar{Name: "CHANGE", Value: "new"}},
			{Containers: []string{"*"}, Env: corev1.EnvVar{Name: "ADDED", Value: "2"}},
		},
	})
	ops, err := json.Marshal(Patch(before, after))
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("applying %s: %v", ops, err)
	}
	var got map[string]any
	if err := json.Unmarshal(patched, &got); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]any{
		"metadata.labels.futureLabelPolicy":        "x",
		"metadata.labels.runwarden.dev/injected":   "true",
		"spec.futurePodField.a":                    1.0,
		"spec.tolerations.0.futureTolerationField": 1.0,
		"spec.tolerations.1.key":                   "pool",
		"spec.affinity.futureAffinity.b":           2.0,
		"spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.0.futureTermField":        3.0,
		"spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.0.matchExpressions.1.key": "pool",
		"spec.volumes.0.futureVolumeSource.size": 1.0,
		"spec.volumes.1.name":                    "vault-token",
		"spec.containers.0.futureContainerField": true,
		"spec.containers.0.env.0.futureEnvField": "kept",
		"spec.containers.0.env.1.value":          "new",
		"spec.containers.0.env.2.name":           "ADDED",
	} {
		if v := lookup(got, path); v != want {
			t.Errorf("%s = %v, want %v (patch %s)", path, v, want, ops)
		}
	}
}

// lookup follows a dotted path of map keys and list indexes; a key may hold
// dots when no shorter key matches.
func lookup(v any, path string) any {
	if path == "" {
		return v
	}
	switch n := v.(type) {
	case map[string]any:
		for i := len(path); i > 0; i-- {
			if i < len(path) && path[i] != '.' {
				continue
			}
			if c, ok := n[path[:i]]; ok {
				rest := ""
				if i < len(path) {
					rest = path[i+1:]
				}
				if r := lookup(c, rest); r != nil {
					return r
				}
			}
		}
	case []any:
		var i int
		j := 0
		for j < len(path) && path[j] >= '0' && path[j] <= '9' {
			i = i*10 + int(path[j]-'0')
			j++
		}
		if j == 0 || i >= len(n) {
			return nil
		}
		rest := ""
		if j < len(path) {
			rest = path[j+1:]
		}
		return lookup(n[i], rest)
	}
	return nil
}

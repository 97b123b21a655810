package admission

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/webhook/policy"
)

// FuzzDecisionToPatch feeds arbitrary decisions (as JSON) and pods: the
// mutations applied twice equal them applied once, and the JSON patch the
// webhook returns (Patch) turns the original pod's JSON into exactly the
// mutated pod's.
func FuzzDecisionToPatch(f *testing.F) {
	f.Add([]byte(`{"labels":{"a":"b"},"env":[{"containers":["main"],"env":{"name":"X","value":"1"}}]}`), []byte(`{"spec":{"containers":[{"name":"main"}]}}`))
	f.Add([]byte(`{"tolerations":[{"key":"k","operator":"Exists"}],"nodeAffinity":[{"key":"a","operator":"Exists"}],"volumes":[{"name":"v","emptyDir":{}}]}`), []byte(`{"metadata":{"labels":{"x":"y"}},"spec":{"containers":[{"name":"main","env":[{"name":"X","value":"2"}]}]}}`))
	f.Add([]byte(`{"volumeMounts":[{"containers":["*"],"volumeMount":{"name":"v","mountPath":"/v"}}],"envFrom":[{"containers":["main"],"envFrom":{"secretRef":{"name":"s"}}}]}`), []byte(`{"spec":{"containers":[{"name":"main"},{"name":"b"}]}}`))
	f.Add([]byte(`{"env":[{"containers":["*"],"env":{"name":"X","value":"1"}}],"volumeMounts":[{"containers":["clone"],"volumeMount":{"name":"v","mountPath":"/v"}}]}`), []byte(`{"spec":{"initContainers":[{"name":"clone"}],"containers":[{"name":"main"}]}}`))
	f.Fuzz(func(t *testing.T, mutationsJSON, podJSON []byte) {
		var m policy.Mutations
		if json.Unmarshal(mutationsJSON, &m) != nil {
			return
		}
		pod := &corev1.Pod{}
		if json.Unmarshal(podJSON, pod) != nil {
			return
		}
		original, err := json.Marshal(pod)
		if err != nil {
			return
		}
		before := pod.DeepCopy()
		Apply(pod, m)
		once := pod.DeepCopy()
		Apply(pod, m)
		if diff := cmp.Diff(once, pod); diff != "" {
			t.Fatalf("applying twice differs from once:\n%s", diff)
		}
		mutated, err := json.Marshal(once)
		if err != nil {
			t.Fatal(err)
		}
		// The patch as the webhook sends it (encodePatch), byte for byte
		// what json.Marshal makes of the operations.
		ops, err := encodePatch(Patch(before, once))
		if err != nil {
			t.Fatal(err)
		}
		if want, err := json.Marshal(Patch(before, once)); err != nil || string(ops) != string(want) {
			t.Fatalf("encodePatch differs from json.Marshal (%v):\n%s\n%s", err, ops, want)
		}
		patch, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			t.Fatalf("the webhook's patch does not decode: %v", err)
		}
		patched, err := patch.Apply(original)
		if err != nil {
			t.Fatalf("the webhook's patch does not apply: %v\n%s", err, ops)
		}
		var got, want any
		_ = json.Unmarshal(patched, &got)
		_ = json.Unmarshal(mutated, &want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("patched pod differs from the mutated pod:\n%s", diff)
		}
	})
}

// "*" reaches init containers too, and a mutation may name one.
func TestApplyReachesInitContainers(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "clone"}},
		Containers:     []corev1.Container{{Name: "main"}},
	}}
	Apply(pod, policy.Mutations{
		Env:          []policy.ContainerEnv{{Containers: []string{"*"}, Env: corev1.EnvVar{Name: "X", Value: "1"}}},
		VolumeMounts: []policy.ContainerVolumeMount{{Containers: []string{"clone"}, VolumeMount: corev1.VolumeMount{Name: "creds", MountPath: "/creds"}}},
	})
	if c := pod.Spec.InitContainers[0]; len(c.Env) != 1 || len(c.VolumeMounts) != 1 {
		t.Errorf("init container: env %v, mounts %v", c.Env, c.VolumeMounts)
	}
	if c := pod.Spec.Containers[0]; len(c.Env) != 1 || len(c.VolumeMounts) != 0 {
		t.Errorf("main container: env %v, mounts %v", c.Env, c.VolumeMounts)
	}
}

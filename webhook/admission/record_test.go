package admission

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/webhook/policy"
)

func TestMutationNames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		m    policy.Mutations
		want []string
	}{
		{name: "none", want: []string{}},
		{
			name: "every kind, sorted, each name once, no value",
			m: policy.Mutations{
				Labels:       map[string]string{"b": "1"},
				Annotations:  map[string]string{"a": "2"},
				NodeSelector: map[string]string{"pool": "runners"},
				Tolerations:  []corev1.Toleration{{Key: "runwarden.dev/pool", Value: "x"}},
				NodeAffinity: []corev1.NodeSelectorRequirement{{Key: "zone"}},
				Volumes:      []corev1.Volume{{Name: "aws-iam-token"}},
				Env: []policy.ContainerEnv{
					{Containers: []string{"main"}, Env: corev1.EnvVar{Name: "AWS_ROLE_ARN", Value: "arn:aws:iam::1:role/r"}},
					{Containers: []string{"side"}, Env: corev1.EnvVar{Name: "AWS_ROLE_ARN", Value: "arn:aws:iam::1:role/r"}},
				},
				EnvFrom: []policy.ContainerEnvFrom{
					{EnvFrom: corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}}},
					{EnvFrom: corev1.EnvFromSource{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
				},
				VolumeMounts: []policy.ContainerVolumeMount{{VolumeMount: corev1.VolumeMount{Name: "aws-iam-token", MountPath: "/var/run"}}},
			},
			want: []string{
				"annotation a", "env AWS_ROLE_ARN", "envFrom configMap settings", "envFrom secret creds", "label b",
				"nodeAffinity zone", "nodeSelector pool", "toleration runwarden.dev/pool", "volume aws-iam-token", "volumeMount aws-iam-token",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, MutationNames(tt.m)); diff != "" {
				t.Errorf("MutationNames (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSpecDigestIsTheSpecsJSON checks that SpecDigest, which streams the
// encoding of the spec by pointer, is the SHA-256 of json.Marshal of the
// spec by value, as recorded on pods before: equal for specs with
// quantities, int-or-strings, characters JSON escapes and an empty spec,
// and no type a PodSpec encodes has a MarshalJSON or MarshalText on its
// pointer only (which encoding/json calls only for addressable values).
func TestSpecDigestIsTheSpecsJSON(t *testing.T) {
	t.Parallel()
	rich := runnerPod("registry.example.com/runner:1 <&>").Spec
	rich.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1.5Gi")},
	}
	rich.Containers[0].Command = []string{"sh", "-c", "echo \"a\nb\" \u2028 é"}
	rich.Containers[0].LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http")}}}
	rich.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("1Mi"))}}}}
	rich.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.1")}
	tests := []struct {
		name string
		spec corev1.PodSpec
	}{
		{name: "empty"},
		{name: "runner pod", spec: runnerPod("registry.example.com/runner:1").Spec},
		{name: "quantities, int-or-string, escapes", spec: rich},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(b)
			if got, want := SpecDigest(tt.spec), "sha256:"+hex.EncodeToString(sum[:]); got != want {
				t.Errorf("SpecDigest = %s, want the SHA-256 of json.Marshal of the spec, %s", got, want)
			}
		})
	}
	t.Run("no pointer-only marshalers", func(t *testing.T) {
		t.Parallel()
		marshaler, textMarshaler := reflect.TypeFor[json.Marshaler](), reflect.TypeFor[encoding.TextMarshaler]()
		seen := map[reflect.Type]bool{}
		var walk func(reflect.Type)
		walk = func(ty reflect.Type) {
			if seen[ty] {
				return
			}
			seen[ty] = true
			if ty.Kind() != reflect.Pointer {
				if p := reflect.PointerTo(ty); (p.Implements(marshaler) && !ty.Implements(marshaler)) || (p.Implements(textMarshaler) && !ty.Implements(textMarshaler)) {
					t.Errorf("%v marshals differently by pointer and by value", ty)
				}
			}
			if ty.Implements(marshaler) || ty.Implements(textMarshaler) {
				return // encoded by its own method, not field by field
			}
			switch ty.Kind() {
			case reflect.Pointer, reflect.Slice, reflect.Array:
				walk(ty.Elem())
			case reflect.Map:
				walk(ty.Key())
				walk(ty.Elem())
			case reflect.Struct:
				for f := range ty.Fields() {
					if f.IsExported() || f.Anonymous {
						walk(f.Type)
					}
				}
			}
		}
		walk(reflect.TypeFor[corev1.PodSpec]())
	})
}

package admission

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

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

package harness

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Every container of a release pod is checked, init and ephemeral ones
// included, by its image and by what its node pulled; one without a status
// is not taken as released.
func TestUnreleasedContainers(t *testing.T) {
	t.Parallel()
	const (
		dispatcher = "localhost:5000/runwarden/dispatcher@sha256:1111"
		webhook    = "localhost:5000/runwarden/webhook@sha256:2222"
		other      = "localhost:5000/runwarden/dispatcher@sha256:9999"
	)
	released := []string{dispatcher, webhook}
	pod := func(edit func(p *corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: dispatcher}}},
			Status:     corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "main", ImageID: dispatcher}}},
		}
		edit(p)
		return p
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{
			name: "one released container",
			pod:  pod(func(*corev1.Pod) {}),
		},
		{
			name: "every container released, init and ephemeral ones too",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: webhook}}
				p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", ImageID: webhook}}
				p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: dispatcher}}}
				p.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debug", ImageID: dispatcher}}
			}),
		},
		{
			name: "a second container that is not released",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar", Image: "example.com/sidecar:1"})
				p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "sidecar", ImageID: "example.com/sidecar@sha256:3333"})
			}),
			want: []string{`pod p: container sidecar names image "example.com/sidecar:1", not one of the release's by digest`},
		},
		{
			name: "an init container that pulled something else",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: webhook}}
				p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", ImageID: other}}
			}),
			want: []string{`pod p: init container init runs "` + other + `", not one of the release's images`},
		},
		{
			name: "an ephemeral container of an image the release does not hold",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: other}}}
				p.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debug", ImageID: other}}
			}),
			want: []string{`pod p: ephemeral container debug names image "` + other + `", not one of the release's by digest`},
		},
		{
			name: "a container with no status",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "second", Image: webhook})
			}),
			want: []string{"pod p: container second has no status: what it runs is unknown"},
		},
		{
			name: "the first container pulled by tag, not the digest",
			pod: pod(func(p *corev1.Pod) {
				p.Status.ContainerStatuses[0].ImageID = "localhost:5000/runwarden/dispatcher:v1"
			}),
			want: []string{`pod p: container main runs "localhost:5000/runwarden/dispatcher:v1", not one of the release's images`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tt.want, UnreleasedContainers(tt.pod, released)); diff != "" {
				t.Errorf("UnreleasedContainers (-want +got):\n%s", diff)
			}
		})
	}
}

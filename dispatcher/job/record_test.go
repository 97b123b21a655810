package job

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/internal/contract"
)

// A Job's record comes from its newest pod: the webhook's annotations, the
// images the node ran, the node; and from the Job, the template's digest.
// The same template gives the same digest, another template another.
func TestReadRecord(t *testing.T) {
	t.Parallel()
	j, _, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	started, finished := metav1.NewTime(time.Unix(1_700_000_100, 0)), metav1.NewTime(time.Unix(1_700_000_160, 0))
	j.UID = "job-uid-1"
	pod := func(name string, age time.Duration, node string) *corev1.Pod {
		p := ownPod(j, name, time.Unix(1_700_000_000, 0).Add(-age))
		p.Annotations = map[string]string{contract.AnnotationSpecDigest: "sha256:" + node, contract.AnnotationPolicyDigest: "p1",
			contract.AnnotationMutations: "env A, volume v", contract.AnnotationWarnings: "w1; w2"}
		p.Spec = corev1.PodSpec{NodeName: node}
		p.Status = corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Image: "runner:1", ImageID: "runner@sha256:1",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: started, FinishedAt: finished}}}}}
		return p
	}
	c := fake.NewClientBuilder().WithObjects(pod("old", time.Hour, "n-old"), pod("new", 0, "n-new")).Build()
	got, err := ReadRecord(t.Context(), c, j)
	if err != nil {
		t.Fatal(err)
	}
	want := &v1alpha1.TaskRecord{SpecDigest: "sha256:n-new", ShortSpecDigest: "n-new", PolicyDigest: "p1", TemplateDigest: templateDigest(options(t).Template),
		Mutations: []string{"env A", "volume v"}, Warnings: []string{"w1", "w2"},
		Images: []v1alpha1.ImageRecord{{Container: "main", Image: "runner:1", ImageID: "runner@sha256:1"}}, Node: "n-new", Pod: "new",
		StartedAt: &started, FinishedAt: &finished}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	o := options(t)
	o.Template.Spec.Containers[0].Image = "other:2"
	if templateDigest(o.Template) == want.TemplateDigest || j.Annotations[AnnotationTemplateDigest] != want.TemplateDigest {
		t.Error("the template digest does not tell templates apart, or is not on the Job")
	}
	if Short("sha256:0123456789abcdef") != "0123456789ab" || Short("") != "" {
		t.Error("Short")
	}
}

package orchestrator

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/contract"
)

// The log streamed as a task's is its Job's own pod's: a pod planted with
// the Job's job-name label, scheduled and listed first, is never opened,
// and a pod of the streamed pod's name that is not the Job's reads as gone
// (job.IsPodOf).
func TestLogsAreTheJobsOwnPods(t *testing.T) {
	t.Parallel()
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "rw-t-1", Namespace: "runners", UID: "job-uid-1",
		Labels: map[string]string{contract.TaskID: "t-1", contract.LabelDispatcher: "d1"}}}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: j.Namespace,
				Labels:          map[string]string{batchv1.JobNameLabel: j.Name, contract.LabelRunner: "true", contract.TaskID: "t-1"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: "node-1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
				Name: job.RunnerContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			}}},
		}
	}
	for _, c := range []struct {
		name  string
		plant func(p *corev1.Pod)
	}{
		{"the job-name label alone", func(p *corev1.Pod) {
			p.Labels, p.OwnerReferences = map[string]string{batchv1.JobNameLabel: j.Name}, nil
		}},
		{"a forged owner reference with another UID", func(p *corev1.Pod) { p.OwnerReferences[0].UID = "forged" }},
		{"no runner label", func(p *corev1.Pod) { delete(p.Labels, contract.LabelRunner) }},
		{"another task's label", func(p *corev1.Pod) { p.Labels[contract.TaskID] = "t-2" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Named to be listed before the Job's own.
			planted := pod("a-planted")
			c.plant(planted)
			alone := New(Options{Kube: fake.NewClientBuilder().WithObjects(planted.DeepCopy()).Build()})
			if got := alone.runnerPod(t.Context(), j); got != "" {
				t.Errorf("with the planted pod alone, the log is read from %q, want none", got)
			}
			own := pod("rw-t-1-abcde")
			s := New(Options{Kube: fake.NewClientBuilder().WithObjects(planted, own).Build()})
			if got := s.runnerPod(t.Context(), j); got != own.Name {
				t.Errorf("the log is read from %q, want the Job's own pod %s", got, own.Name)
			}
			if !s.containerDone(t.Context(), j, planted.Name) {
				t.Error("the planted pod, running, reads as the Job's running pod")
			}
			if s.containerDone(t.Context(), j, own.Name) {
				t.Error("the Job's own running pod reads as done")
			}
		})
	}
}

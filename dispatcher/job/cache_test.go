package job

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runwarden/runwarden/internal/contract"
)

func TestCacheTransformKeepsWhatTheDispatcherReads(t *testing.T) {
	t.Parallel()
	j, _, err := Build(Task{ID: "t-1", Namespace: "ns", Image: "runner:1"}, Options{DispatcherID: "d"})
	if err != nil {
		t.Fatal(err)
	}
	j.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "x"}}
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	out, err := CacheTransform()(j)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*batchv1.Job)
	if got.ManagedFields != nil || len(got.Spec.Template.Spec.Containers) != 0 {
		t.Errorf("job not trimmed: %+v", got)
	}
	if !Finished(got) || got.Annotations[contract.TaskID] != "t-1" || got.Labels[contract.LabelDispatcher] != "d" || *got.Spec.BackoffLimit != 0 {
		t.Errorf("job lost what is read: %+v", got)
	}

	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"batch.kubernetes.io/job-name": j.Name}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "main", Image: "runner:1"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
	out, _ = CacheTransform()(p)
	gp := out.(*corev1.Pod)
	if gp.ManagedFields != nil || len(gp.Spec.Containers) != 0 || gp.Spec.NodeName != "n1" || !podState([]corev1.Pod{*gp}).running || gp.Labels["batch.kubernetes.io/job-name"] != j.Name {
		t.Errorf("pod trimmed wrong: %+v", gp)
	}
	// Other objects pass untouched.
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}}
	if out, _ := CacheTransform()(s); out.(*corev1.Secret).ManagedFields == nil {
		t.Error("a Secret was changed")
	}
}

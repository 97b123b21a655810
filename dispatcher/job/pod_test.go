package job

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/internal/contract"
)

// ownPod is a pod as the Job controller makes it for j and the webhook
// admits it: its controller reference, the Job controller's labels and
// the template's runner and task labels.
func ownPod(j *batchv1.Job, name string, created time.Time) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: j.Namespace, CreationTimestamp: metav1.NewTime(created),
		Labels: map[string]string{
			batchv1.JobNameLabel: j.Name, batchv1.ControllerUidLabel: string(j.UID),
			contract.LabelRunner: "true", contract.TaskID: j.Labels[contract.TaskID],
		},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
	}}
}

// plantedPods are pods that claim Job j's job-name label but are not its
// own, each made by what a user who may create pods can write: any label
// but the runner label (the webhook refuses that one to all but the Job
// controller), any owner reference.
func plantedPods(j *batchv1.Job, created time.Time) map[string]*corev1.Pod {
	planted := map[string]func(p *corev1.Pod){
		"the job-name label alone": func(p *corev1.Pod) {
			p.Labels = map[string]string{batchv1.JobNameLabel: j.Name}
			p.OwnerReferences = nil
		},
		"every label but no owner reference": func(p *corev1.Pod) {
			p.OwnerReferences = nil
		},
		"a forged owner reference with another UID": func(p *corev1.Pod) {
			p.OwnerReferences[0].UID = "forged-uid"
		},
		"an owner reference that is not the controller": func(p *corev1.Pod) {
			p.OwnerReferences[0].Controller = nil
		},
		"a controller of another kind": func(p *corev1.Pod) {
			p.OwnerReferences[0].Kind = "CronJob"
		},
		"a controller of another API version": func(p *corev1.Pod) {
			p.OwnerReferences[0].APIVersion = "batch/v2"
		},
		"a controller reference naming another Job": func(p *corev1.Pod) {
			p.OwnerReferences[0].Name = "rw-other"
		},
		"no runner label": func(p *corev1.Pod) {
			delete(p.Labels, contract.LabelRunner)
		},
		"the runner label not true": func(p *corev1.Pod) {
			p.Labels[contract.LabelRunner] = "false"
		},
		"another task's label": func(p *corev1.Pod) {
			p.Labels[contract.TaskID] = "another-task"
		},
		"no task label": func(p *corev1.Pod) {
			delete(p.Labels, contract.TaskID)
		},
	}
	pods := map[string]*corev1.Pod{}
	for name, change := range planted {
		p := ownPod(j, "planted", created)
		change(p)
		pods[name] = p
	}
	return pods
}

func ownJob() *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: "rw-t-1", Namespace: "runners", UID: "job-uid-1",
		Labels: map[string]string{contract.TaskID: "t-1", contract.LabelDispatcher: "dispatcher-a"},
	}}
}

// TestIsPodOf: only a pod whose controller reference names the Job by its
// UID, and that carries the runner label and the Job's task label, is the
// Job's.
func TestIsPodOf(t *testing.T) {
	t.Parallel()
	j := ownJob()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type test struct {
		name string
		job  *batchv1.Job
		pod  *corev1.Pod
		want bool
	}
	tests := []test{
		{name: "the Job controller's pod", job: j, pod: ownPod(j, "own", created), want: true},
		{name: "a Job without a UID", job: &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: j.Name, Namespace: j.Namespace, Labels: j.Labels}}, pod: ownPod(j, "own", created)},
		{name: "a Job without a task label", job: &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: j.Name, Namespace: j.Namespace, UID: j.UID}}, pod: ownPod(j, "own", created)},
		{name: "a pod of another namespace", job: j, pod: func() *corev1.Pod {
			p := ownPod(j, "own", created)
			p.Namespace = "elsewhere"
			return p
		}()},
		{name: "no pod", job: j},
	}
	for name, p := range plantedPods(j, created) {
		tests = append(tests, test{name: "planted: " + name, job: j, pod: p})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := IsPodOf(tt.job, tt.pod); got != tt.want {
				t.Errorf("IsPodOf = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPlantedPodsAreIgnored: a pod planted with a running task's job-name
// label, showing an image that cannot be pulled, neither fails nor stops
// the task, nor becomes its record, nor the pod whose log is read; each
// reader sees the Job's own pod alone.
func TestPlantedPodsAreIgnored(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j := ownJob()
	j.CreationTimestamp = metav1.NewTime(created)
	own := ownPod(j, "rw-t-1-abcde", created)
	own.Annotations = map[string]string{contract.AnnotationSpecDigest: "sha256:own", contract.AnnotationPolicyDigest: "p-own", contract.AnnotationMutations: "env A"}
	own.Spec.NodeName = "node-own"
	own.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: RunnerContainer, Image: "runner:1", ImageID: "runner@sha256:1",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created)}},
	}}}
	for name, planted := range plantedPods(j, created.Add(time.Minute)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			planted.Annotations = map[string]string{contract.AnnotationSpecDigest: "sha256:planted", contract.AnnotationPolicyDigest: "p-planted", contract.AnnotationWarnings: "all is well"}
			planted.Spec.NodeName = "node-planted"
			planted.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
				Name: RunnerContainer, Image: "registry.example.com/planted:1",
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "pull access denied"}},
			}}}
			c := fake.NewClientBuilder().WithObjects(own.DeepCopy(), planted).WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string {
				return []string{o.(*corev1.Event).InvolvedObject.Name}
			}).Build()

			out, err := Observer{Client: c, Now: func() time.Time { return created.Add(2 * time.Minute) }}.Outcome(t.Context(), j)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(Outcome{Running: true}, out); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}

			rec, err := ReadRecord(t.Context(), c, j)
			if err != nil {
				t.Fatal(err)
			}
			want := &v1alpha1.TaskRecord{SpecDigest: "sha256:own", ShortSpecDigest: "own", PolicyDigest: "p-own", Mutations: []string{"env A"},
				Images: []v1alpha1.ImageRecord{{Container: RunnerContainer, Image: "runner:1", ImageID: "runner@sha256:1"}},
				Node:   "node-own", Pod: own.Name, StartedAt: ptr.To(metav1.NewTime(created))}
			if diff := cmp.Diff(want, rec); diff != "" {
				t.Errorf("record (-want +got):\n%s", diff)
			}

			for _, readOnly := range []bool{true, false} {
				pods, err := PodsOf(t.Context(), c, j, readOnly)
				if err != nil {
					t.Fatal(err)
				}
				if len(pods) != 1 || pods[0].Name != own.Name {
					t.Errorf("PodsOf (read-only %v) = %v, want the Job's own pod %s alone", readOnly, podNames(pods), own.Name)
				}
			}
		})
	}
}

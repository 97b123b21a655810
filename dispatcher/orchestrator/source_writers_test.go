package orchestrator_test

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/internal/contract"
)

// TestForgedJobAnnotationsAreNotBelieved: what whoever may patch Jobs
// writes on a task's Job, where the chart's writers policy is not
// installed, does not tell the source a task's outcome. An outcome
// annotation on a running Job is not the task's outcome (stop records one
// only with the Job's suspension, and never a success); a task annotation
// rewritten on t-1's finished Job to t-2 does not report t-2.
func TestForgedJobAnnotationsAreNotBelieved(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// forge changes t-1's Job, given the leases of t-1 and t-2.
		forge func(j *batchv1.Job, t1, t2 orchestrator.Lease)
	}{
		{name: "a success recorded on a running Job", forge: func(j *batchv1.Job, _, _ orchestrator.Lease) {
			j.Annotations[orchestrator.AnnotationOutcome] = `{"Phase":"Succeeded","Reason":"Completed","Message":"forged"}`
		}},
		{name: "a failure recorded on a running Job", forge: func(j *batchv1.Job, _, _ orchestrator.Lease) {
			j.Annotations[orchestrator.AnnotationOutcome] = `{"Phase":"Failed","Reason":"ImagePullError","Message":"forged"}`
		}},
		{name: "a success recorded on a suspended Job", forge: func(j *batchv1.Job, _, _ orchestrator.Lease) {
			j.Spec.Suspend = ptr.To(true)
			j.Annotations[orchestrator.AnnotationOutcome] = `{"Phase":"Succeeded","Reason":"Completed","Message":"forged"}`
		}},
		{name: "t-1's finished Job renamed t-2's", forge: func(j *batchv1.Job, _, t2 orchestrator.Lease) {
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
			j.Annotations[contract.TaskID] = "t-2"
			j.Annotations[orchestrator.AnnotationLeaseID] = t2.LeaseID
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := orchestratortest.New(orchestratortest.Options{LeaseSeconds: 60, MaxWait: time.Second})
			srv.Start()
			t.Cleanup(srv.Close)
			c, err := orchestrator.NewClient(orchestrator.ClientOptions{URL: srv.URL(), DispatcherID: "d-1", Transport: srv.Client().Transport})
			if err != nil {
				t.Fatal(err)
			}
			srv.Add(orchestrator.Task{ID: "t-1", Command: []string{"true"}})
			srv.Add(orchestrator.Task{ID: "t-2", Command: []string{"true"}})
			leases, err := c.Poll(t.Context(), 2, 2, nil, 0)
			if err != nil || len(leases) != 2 {
				t.Fatalf("leases: %+v, %v", leases, err)
			}
			byID := map[string]orchestrator.Lease{}
			for _, l := range leases {
				byID[l.Task.ID] = l
			}
			created := metav1.NewTime(time.Now().Add(-time.Minute))
			j := &batchv1.Job{
				ObjectMeta: metav1.ObjectMeta{
					Name: job.Name("t-1"), Namespace: "runners", UID: "job-uid-1", CreationTimestamp: created,
					Labels: map[string]string{contract.LabelDispatcher: "d-1", contract.TaskID: "t-1"},
					Annotations: map[string]string{
						contract.TaskID: "t-1", orchestrator.AnnotationLeaseID: byID["t-1"].LeaseID,
						orchestrator.AnnotationLeaseEpoch: "1", orchestrator.AnnotationLeaseSeconds: "60",
					},
				},
			}
			tt.forge(j, byID["t-1"], byID["t-2"])
			kube := fake.NewClientBuilder().WithObjects(j).WithIndex(&corev1.Event{}, "involvedObject.name", func(o crclient.Object) []string {
				return []string{o.(*corev1.Event).InvolvedObject.Name}
			}).Build()
			s := orchestrator.New(orchestrator.Options{
				Client: c, Kube: kube, Namespace: "runners", PollWait: time.Second,
				Jobs: job.Options{DispatcherID: "d-1", Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "runner:1"}}}}},
			})
			if _, err := s.Reconcile(t.Context(), reconcile.Request{NamespacedName: crclient.ObjectKeyFromObject(j)}); err != nil {
				t.Errorf("reconcile: %v", err)
			}
			for _, id := range []string{"t-1", "t-2"} {
				if rec := srv.Task(id); rec.Final != nil {
					t.Errorf("%s reported %s %s: %s", id, rec.Final.Type, rec.Final.Reason, rec.Final.Message)
				}
			}
			var got batchv1.Job
			if err := kube.Get(t.Context(), crclient.ObjectKeyFromObject(j), &got); err != nil {
				t.Fatal(err)
			}
			if got.Annotations[orchestrator.AnnotationReported] != "" {
				t.Errorf("the Job was marked reported: %v", got.Annotations)
			}
		})
	}
}

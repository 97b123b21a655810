package orchestrator_test

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/internal/contract"
)

// A finished Job whose annotations record the task's first lease, while the
// orchestrator stored the task's final event under a lease handed back
// since, is reported and marked: the orchestrator answers the repeated
// final event as stored. Before, the report was refused as stale for ever
// and the dispatcher let the Job go unmarked.
//
// Both cases start the same way: the task's lease expires (its dispatcher
// was killed) and is handed back at epoch 2 to a dispatcher process that
// never writes it to the Job.
func TestFinishedJobIsMarkedWhenItsFinalIsStoredUnderANewerLease(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// end stores the task's final event at epoch 2.
		end  func(t *testing.T, srv *orchestratortest.Server, c *orchestrator.Client, clk *testclock.FakeClock)
		want orchestrator.EventType
	}{{
		// The process that took the handed-back lease reported the outcome
		// and was killed before it wrote the lease to the Job.
		name: "reported by the process that took the handed-back lease",
		end: func(t *testing.T, _ *orchestratortest.Server, c *orchestrator.Client, clk *testclock.FakeClock) {
			t.Helper()
			if err := c.Report(t.Context(), "t-1", orchestrator.Event{IdempotencyKey: "t-1/final", Epoch: 2, Type: orchestrator.EventSucceeded, Reason: job.ReasonCompleted, Time: clk.Now()}); err != nil {
				t.Fatal(err)
			}
		},
		want: orchestrator.EventSucceeded,
	}, {
		// The handed-back lease's answer was lost (its process was killed),
		// the task was cancelled, and no dispatcher listed it as running
		// for a lease duration: the orchestrator ended it itself at epoch
		// 2. (TestOrchestratorSurvivesSIGKILLAndFaults met this: a cancelled
		// task's lease answer dropped in its "lease never seen" window.)
		name: "ended by the orchestrator after a cancel",
		end: func(t *testing.T, srv *orchestratortest.Server, c *orchestrator.Client, clk *testclock.FakeClock) {
			t.Helper()
			srv.Cancel("t-1", "chaos")
			// A poll that does not list the task, a lease's duration
			// apart, until the lease has expired and the task has stayed
			// unheld for a lease's duration.
			for polls := 0; !srv.Task("t-1").Done(); polls++ {
				if polls == 5 {
					t.Fatalf("t-1 not ended by the orchestrator after %d polls a lease's duration apart: %+v", polls, srv.Task("t-1"))
				}
				if _, err := c.Poll(t.Context(), 0, 1, nil, 0); err != nil {
					t.Fatal(err)
				}
				clk.Step(time.Second)
			}
		},
		want: orchestrator.EventCancelled,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := testclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			srv := orchestratortest.New(orchestratortest.Options{LeaseSeconds: 1, Clock: clk})
			srv.Start()
			t.Cleanup(srv.Close)
			c, err := orchestrator.NewClient(orchestrator.ClientOptions{URL: srv.URL(), DispatcherID: "d-1", Transport: srv.Client().Transport})
			if err != nil {
				t.Fatal(err)
			}
			srv.Add(orchestrator.Task{ID: "t-1", Command: []string{"true"}})
			first, err := c.Poll(t.Context(), 1, 1, nil, 0)
			if err != nil || len(first) != 1 {
				t.Fatalf("first lease: %+v, %v", first, err)
			}
			if err := c.Report(t.Context(), "t-1", orchestrator.Event{IdempotencyKey: "t-1/job-created", Epoch: 1, Type: orchestrator.EventJobCreated, JobName: job.Name("t-1"), Time: clk.Now()}); err != nil {
				t.Fatal(err)
			}
			// The first lease expires; the next poll that lists the task
			// as running gets it back.
			clk.Step(time.Second)
			again, err := c.Poll(t.Context(), 0, 1, []string{"t-1"}, 0)
			if err != nil || len(again) != 1 || again[0].Epoch != 2 {
				t.Fatalf("handed-back lease: %+v, %v; want epoch 2", again, err)
			}
			tt.end(t, srv, c, clk)

			done := &batchv1.Job{
				ObjectMeta: metav1.ObjectMeta{
					Name: job.Name("t-1"), Namespace: "runners", Labels: map[string]string{contract.LabelDispatcher: "d-1"},
					Annotations: map[string]string{
						contract.TaskID: "t-1", orchestrator.AnnotationLeaseID: first[0].LeaseID,
						orchestrator.AnnotationLeaseEpoch: "1", orchestrator.AnnotationLeaseSeconds: "1",
					},
				},
				Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}},
			}
			kube := fake.NewClientBuilder().WithObjects(done).WithIndex(&corev1.Event{}, "involvedObject.name", func(o crclient.Object) []string {
				return []string{o.(*corev1.Event).InvolvedObject.Name}
			}).Build()
			s := orchestrator.New(orchestrator.Options{
				Client: c, Kube: kube, Namespace: "runners", PollWait: time.Second,
				Jobs: job.Options{DispatcherID: "d-1", Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "runner:1"}}}}},
			})
			key := crclient.ObjectKeyFromObject(done)
			if _, err := s.Reconcile(t.Context(), reconcile.Request{NamespacedName: key}); err != nil {
				t.Errorf("reconcile: %v", err)
			}
			var j batchv1.Job
			if err := kube.Get(t.Context(), key, &j); err != nil || j.Annotations[orchestrator.AnnotationReported] != "true" {
				t.Errorf("the Job is not marked reported: %v, annotations %v", err, j.Annotations)
			}
			rec := srv.Task("t-1")
			if rec.FinalStored != 1 || rec.Final == nil || rec.Final.Type != tt.want || rec.Final.Epoch != 2 || rec.Repeats == 0 {
				t.Errorf("t-1: %d final events stored, final %+v, %d repeats; want one %s at epoch 2, answered again", rec.FinalStored, rec.Final, rec.Repeats, tt.want)
			}
		})
	}
}

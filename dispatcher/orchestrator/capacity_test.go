package orchestrator

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/contract"
)

// acceptingClient is a client of an orchestrator that accepts every
// request.
func acceptingClient(t *testing.T) *Client {
	t.Helper()
	c, err := NewClient(ClientOptions{URL: "https://orch.example", DispatcherID: "d-1", Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// freeSlots is how many leases the source's next poll may ask for.
func freeSlots(s *Source) int {
	free, _, _, _ := s.leases.capacity(s.opts.MaxConcurrent, s.opts.MaxQueued)
	return free
}

// A cancelled task's slot frees only once its Job can no longer run: after
// its outcome is recorded and the Job suspended. Before, the slot freed
// first, and a new Job could start beside the cancelled one, past
// --max-concurrent; a write that fails keeps the slot taken.
func TestCancelledTaskHoldsItsSlotUntilItsJobIsSuspended(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// failSuspend has the write that records the outcome and
		// suspends the Job fail.
		failSuspend bool
		wantFree    int
		wantSuspend bool
	}{
		{name: "the suspend fails", failSuspend: true, wantFree: 0, wantSuspend: false},
		{name: "the suspend lands", wantFree: 1, wantSuspend: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			running := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: job.Name("t-1"), Namespace: "runners", Annotations: map[string]string{
				contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "1", AnnotationLeaseSeconds: "60",
			}}}
			var s *Source
			var mu sync.Mutex
			var freeAtSuspend []int
			kube := fake.NewClientBuilder().WithObjects(running).WithInterceptorFuncs(interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					data, _ := patch.Data(obj)
					if strings.Contains(string(data), `"suspend":true`) {
						mu.Lock()
						freeAtSuspend = append(freeAtSuspend, freeSlots(s))
						mu.Unlock()
						if tt.failSuspend {
							return apierrors.NewServiceUnavailable("answered by the test")
						}
					}
					return c.Patch(ctx, obj, patch, opts...)
				},
			}).Build()
			s = New(Options{
				Client: acceptingClient(t), Kube: kube, Namespace: "runners",
				Options: runner.Options{MaxConcurrent: 1, Clock: testclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))},
			})
			s.log = logr.Discard()
			tk, _ := s.adopt(running)
			s.leases.cancelled(tk, "stopped by the test")
			if got := freeSlots(s); got != 0 {
				t.Fatalf("%d slots free while the task runs, want 0", got)
			}

			out := job.Outcome{Phase: job.PhaseCancelled, Reason: job.ReasonCancelled, Message: "cancelled by the orchestrator", Stop: true}
			_, err := s.finish(t.Context(), tk, running.DeepCopy(), out)
			if tt.failSuspend != (err != nil) {
				t.Errorf("finish: %v, want an error %v", err, tt.failSuspend)
			}
			mu.Lock()
			if diff := cmp.Diff([]int{0}, freeAtSuspend); diff != "" {
				t.Errorf("free slots when the Job was suspended (-want +got):\n%s", diff)
			}
			mu.Unlock()
			if got := freeSlots(s); got != tt.wantFree {
				t.Errorf("%d slots free after finish, want %d", got, tt.wantFree)
			}
			var got batchv1.Job
			if err := kube.Get(t.Context(), client.ObjectKeyFromObject(running), &got); err != nil {
				t.Fatal(err)
			}
			if suspended := ptr.Deref(got.Spec.Suspend, false) && got.Annotations[AnnotationOutcome] != ""; suspended != tt.wantSuspend {
				t.Errorf("the Job suspended with its outcome: %v, want %v", suspended, tt.wantSuspend)
			}
		})
	}
}

// A new leader counts the Job an earlier one left awaiting its Secret
// until startOver deleted it: it is the dispatcher's, and unfinished. A
// Job that cannot be deleted stays counted until a new lease of its task
// comes (whose start deletes it).
func TestJobAwaitingDeletionHoldsASlot(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		failDelete bool
		// wantFree is the free slots after startOver.
		wantFree int
	}{
		{name: "deleted", wantFree: 1},
		{name: "the delete fails", failDelete: true, wantFree: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			left := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
				Name: job.Name("t-1"), Namespace: "runners", UID: "u-1", Labels: map[string]string{contract.LabelDispatcher: "d-1"},
				Annotations: map[string]string{contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "1", job.AnnotationAwaitingSecret: "true"},
			}, Spec: batchv1.JobSpec{Suspend: ptr.To(true)}}
			var s *Source
			var freeAtDelete []int
			kube := fake.NewClientBuilder().WithObjects(left).WithInterceptorFuncs(interceptor.Funcs{
				Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
					freeAtDelete = append(freeAtDelete, freeSlots(s))
					if tt.failDelete {
						return apierrors.NewServiceUnavailable("answered by the test")
					}
					return c.Delete(ctx, obj, opts...)
				},
			}).Build()
			now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			s = New(Options{
				Client: acceptingClient(t), Kube: kube, Namespace: "runners",
				Jobs: job.Options{DispatcherID: "d-1"}, Options: runner.Options{MaxConcurrent: 1, Clock: testclock.NewFakeClock(now)},
			})
			s.log = logr.Discard()
			awaiting, err := s.restore(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got := freeSlots(s); got != 0 {
				t.Errorf("%d slots free while the Job left awaiting its Secret exists, want 0", got)
			}
			if _, _, _, held := s.leases.capacity(1, 1); len(held) != 0 {
				t.Errorf("tasks listed as running: %v, want none (the lease is handed back)", held)
			}
			s.startOver(t.Context(), awaiting)
			if diff := cmp.Diff([]int{0}, freeAtDelete); diff != "" {
				t.Errorf("free slots when the Job was deleted (-want +got):\n%s", diff)
			}
			if got := freeSlots(s); got != tt.wantFree {
				t.Errorf("%d slots free after startOver, want %d", got, tt.wantFree)
			}
			if tt.wantFree > 0 {
				select {
				case <-s.leases.freed():
				default:
					t.Error("the poll was not woken when the slot freed")
				}
			}
			if !tt.failDelete {
				return
			}
			// A new lease of the task: it takes the Job's place, and its
			// start deletes the Job.
			tk, d, _, _ := s.leases.take(Lease{LeaseID: "l-2", Epoch: 2, LeaseSeconds: 60, Task: Task{ID: "t-1"}}, now, time.Minute, true)
			if tk == nil || d != deliveredFresh {
				t.Fatalf("a new lease of the task left awaiting its Secret: %v, want taken", d)
			}
			if got := freeSlots(s); got != 0 {
				t.Errorf("%d slots free with the task taken again, want 0", got)
			}
		})
	}
}

// A new leader counts a Job being deleted whose outcome is not reported:
// its pods may run until it is gone. Once it is, its task fails (deleted
// before it finished) and the slot frees.
func TestRestoreCountsAJobBeingDeleted(t *testing.T) {
	t.Parallel()
	deleting := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: job.Name("t-1"), Namespace: "runners", UID: "u-1", Labels: map[string]string{contract.LabelDispatcher: "d-1"},
		Annotations:       map[string]string{contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "1", AnnotationLeaseSeconds: "60"},
		DeletionTimestamp: ptr.To(metav1.Now()), Finalizers: []string{metav1.FinalizerDeleteDependents},
	}}
	kube := fake.NewClientBuilder().WithObjects(deleting).Build()
	s := New(Options{
		Client: acceptingClient(t), Kube: kube, Namespace: "runners",
		Jobs: job.Options{DispatcherID: "d-1"}, Options: runner.Options{MaxConcurrent: 1, Clock: testclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))},
	})
	s.log = logr.Discard()
	if _, err := s.restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := freeSlots(s); got != 0 {
		t.Fatalf("%d slots free while a Job being deleted exists, want 0", got)
	}
	gone := deleting.DeepCopy()
	gone.Finalizers = nil
	if err := kube.Update(t.Context(), gone); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(deleting)}); err != nil {
		t.Fatal(err)
	}
	if got := freeSlots(s); got != 1 {
		t.Errorf("%d slots free once the Job is gone, want 1", got)
	}
}

// The table's view is a copy: a change to it changes nothing held.
func TestLeaseViewIsACopy(t *testing.T) {
	t.Parallel()
	lt := newLeaseTable(false)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tk, _, v, _ := lt.take(Lease{LeaseID: "l-1", Epoch: 1, LeaseSeconds: 60, Task: Task{ID: "t-1"}}, now, time.Minute, true)
	v.sent[EventRunning] = true
	v.epoch = 9
	lt.cancelled(tk, "r")
	got, held := lt.view(tk)
	if !held || got.sent[EventRunning] || got.epoch != 1 || got.cancel == nil || got.cancel.reason != "r" {
		t.Errorf("view after changing a copy: %+v (held %v), want epoch 1, nothing sent, cancelled", got, held)
	}
	got.cancel.reason = "changed"
	if again, _ := lt.view(tk); again.cancel.reason != "r" {
		t.Errorf("the cancellation held changed through a view: %q", again.cancel.reason)
	}
}

// A Job made under a task's Job's name by someone else, after the task's
// own Job was deleted, is not taken for the task's Job not yet in the
// cache: read past the cache (which holds only the dispatcher's Jobs), it
// is believed only as this dispatcher's runner Job of the task. The task
// fails, deleted before it finished, and its slot frees, rather than
// waiting on the other Job for ever, its lease renewed.
func TestAJobOfTheTasksNameMadeByAnotherIsNotTheTasks(t *testing.T) {
	t.Parallel()
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: job.Name("t-1"), Namespace: "runners", UID: "u-1", Labels: map[string]string{contract.LabelDispatcher: "d-1"},
		Annotations: map[string]string{contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "1", AnnotationLeaseSeconds: "60"},
	}}
	own.Spec.Template.Labels = map[string]string{contract.LabelRunner: "true"}
	other := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: own.Name, Namespace: "runners", UID: "u-2",
		Annotations: map[string]string{contract.TaskID: "t-1"}}}
	tests := []struct {
		name   string
		reader *batchv1.Job
		// held is whether the task holds its slot after the reconcile.
		held bool
	}{
		{name: "another's Job of the name", reader: other, held: false},
		{name: "the task's own Job, not in the cache yet", reader: own, held: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kube := fake.NewClientBuilder().WithObjects(own.DeepCopy()).Build()
			s := New(Options{
				Client: acceptingClient(t), Kube: kube, Reader: fake.NewClientBuilder().WithObjects(tt.reader.DeepCopy()).Build(), Namespace: "runners",
				Jobs: job.Options{DispatcherID: "d-1"}, Options: runner.Options{MaxConcurrent: 1, Clock: testclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))},
			})
			s.log = logr.Discard()
			if _, err := s.restore(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := kube.Delete(t.Context(), own.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(own)}); err != nil {
				t.Fatal(err)
			}
			if got, want := freeSlots(s), map[bool]int{true: 0, false: 1}[tt.held]; got != want {
				t.Errorf("%d slots free, want %d (the task's slot held: %v)", got, want, tt.held)
			}
		})
	}
}

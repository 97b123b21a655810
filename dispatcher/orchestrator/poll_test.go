package orchestrator

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/clocktest"
	"github.com/runwarden/runwarden/internal/contract"
)

// An orchestrator that answers polls at once, with nothing, is polled no
// more than once per minPollInterval: the next poll waits for the
// source's clock, not for the answer.
func TestEmptyPollsArePaced(t *testing.T) {
	t.Parallel()
	rs := newRenewServer(t, http.StatusOK, 0)
	clk := clocktest.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := New(Options{Client: rs.client(t), Namespace: "runners", Options: runner.Options{Clock: clk}})
	s.log = logr.Discard()
	var stopped atomic.Bool
	done := make(chan error, 1)
	ctx := t.Context()
	go func() {
		done <- s.pollLoop(ctx)
		stopped.Store(true)
	}()
	// The loop polls, then waits on the clock: each time it waits, the
	// poll before is answered.
	for n := int32(1); n <= 4; n++ {
		if err := clk.WaitForWaiters(1, 10*time.Second); err != nil {
			t.Fatalf("after poll %d the loop does not wait on the clock: %v", n, err)
		}
		if got := rs.polls.Load(); got != n {
			t.Fatalf("%d polls while the loop waits, want %d", got, n)
		}
		if n == 4 {
			break
		}
		clk.Step(minPollInterval - time.Millisecond)
		if got := rs.polls.Load(); got != n || !clk.HasWaiters() {
			t.Fatalf("%d polls before minPollInterval passed (the loop waits: %v), want %d", got, clk.HasWaiters(), n)
		}
		clk.Step(time.Millisecond)
	}
	if stopped.Load() {
		t.Errorf("the poll loop stopped: %v", <-done)
	}
}

// Start returns only once what it started has ended: here the hand-back
// of a lease whose Job an earlier process left awaiting its Secret, held
// by the orchestrator until the source stops.
func TestStartWaitsForWhatItStarted(t *testing.T) {
	t.Parallel()
	releasing := make(chan struct{})
	var released atomic.Bool
	c, err := NewClient(ClientOptions{URL: "https://orch.example", DispatcherID: "d-1", Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path != PathRelease("l-1") {
			return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
		}
		close(releasing)
		<-r.Context().Done()
		released.Store(true)
		return nil, r.Context().Err()
	})})
	if err != nil {
		t.Fatal(err)
	}
	left := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: job.Name("t-1"), Namespace: "runners", UID: "u-1", Labels: map[string]string{contract.LabelDispatcher: "d-1"},
		Annotations: map[string]string{contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "1", job.AnnotationAwaitingSecret: "true"},
	}, Spec: batchv1.JobSpec{Suspend: ptr.To(true)}} // as job.Create leaves it
	s := New(Options{
		Client: c, Kube: fake.NewClientBuilder().WithObjects(left).Build(), Namespace: "runners",
		Jobs: job.Options{DispatcherID: "d-1"}, Options: runner.Options{Clock: testclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))},
	})
	s.log = logr.Discard()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	select {
	case <-releasing:
	case <-time.After(10 * time.Second):
		t.Fatal("the lease was not handed back within 10 s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return within 10 s of its context's end")
	}
	if !released.Load() {
		t.Error("Start returned while the hand-back it started was still in flight")
	}
}

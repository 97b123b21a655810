package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// stubLock is a resourcelock.Interface whose writes fail while failing is
// set.
type stubLock struct {
	resourcelock.Interface
	failing bool
}

func (l *stubLock) Identity() string { return "me" }

func (l *stubLock) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	return l.err()
}

func (l *stubLock) Update(context.Context, resourcelock.LeaderElectionRecord) error {
	return l.err()
}

func (l *stubLock) err() error {
	if l.failing {
		return errors.New("unreachable")
	}
	return nil
}

// The fence is open for a renew deadline after the send of the last write
// of the Lease that landed; a failed renewal does not reopen it, a release
// closes it, and writes through fencedClient fail once it is closed.
func TestFenceClosesARenewDeadlineAfterTheLastRenewalSent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stub := &stubLock{}
	lock := &fencedLock{Interface: stub, now: func() time.Time { return now }}
	mine := resourcelock.LeaderElectionRecord{HolderIdentity: "me"}
	ctx := t.Context()
	const deadline = 10 * time.Second
	if lock.renewedWithin(deadline) {
		t.Fatal("open before the Lease was ever taken")
	}
	if err := lock.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	kc := fencedClient{Client: fake.NewClientBuilder().Build(), left: func() time.Duration { return lock.left(deadline) }}
	cm := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	}
	if err := kc.Create(ctx, cm("taken")); err != nil {
		t.Errorf("a write right after the Lease was taken: %v", err)
	}
	now = now.Add(9 * time.Second)
	stub.failing = true
	_ = lock.Update(ctx, mine) // a renewal that does not land
	if !lock.renewedWithin(deadline) {
		t.Error("closed 9s after the last renewal, with a 10s renew deadline")
	}
	now = now.Add(time.Second)
	if lock.renewedWithin(deadline) {
		t.Error("open 10s after the last renewal")
	}
	if err := kc.Create(ctx, cm("late")); !errors.Is(err, errNotLeading) {
		t.Errorf("a write 10s after the last renewal: %v, want refused", err)
	}
	if err := kc.Delete(ctx, cm("taken")); !errors.Is(err, errNotLeading) {
		t.Errorf("a delete 10s after the last renewal: %v, want refused", err)
	}
	stub.failing = false
	if err := lock.Update(ctx, mine); err != nil || !lock.renewedWithin(deadline) {
		t.Errorf("a renewal that lands: %v, open %v", err, lock.renewedWithin(deadline))
	}
	if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil || lock.renewedWithin(deadline) {
		t.Errorf("after a release: %v, open %v; want closed", err, lock.renewedWithin(deadline))
	}
}

// heldWrites is an API server that holds every write until the test lets
// it go or the client gives up on it: a partition, or a server too slow to
// answer, between a write's admission by the fence and its landing.
type heldWrites struct {
	arrived   chan struct{}
	release   chan struct{}
	abandoned chan struct{}
	landed    chan struct{}
}

func newHeldWrites() *heldWrites {
	return &heldWrites{arrived: make(chan struct{}, 1), release: make(chan struct{}),
		abandoned: make(chan struct{}, 1), landed: make(chan struct{}, 1)}
}

func (h *heldWrites) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// With the body read, the server notices the client hanging up.
	_, _ = io.Copy(io.Discard, r.Body)
	h.arrived <- struct{}{}
	select {
	case <-r.Context().Done():
		h.abandoned <- struct{}{}
	case <-h.release:
		h.landed <- struct{}{}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"held","namespace":"ns"}}`)
	}
}

// within waits for ch, failing the test after a minute: a deadline on a
// condition, not a measure of time.
func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s: not within a minute", what)
	}
}

// A write the fence lets through just before it closes is answered before
// the fence closes or fails: held by the server past the fence's close, it
// fails with the fence's deadline, the client gives it up, and nothing
// lands when the server lets it go. Without the deadline (the manager's
// client as it is) the same write waits on and lands once the server lets
// it go, after a standby may lead.
func TestFencedWriteFailsAtTheFencesCloseRatherThanLandingLate(t *testing.T) {
	t.Parallel()
	const (
		renew = 10 * time.Second
		lease = 15 * time.Second
		// How long the fence stays open when the write is let through.
		open = 50 * time.Millisecond
	)
	tests := []struct {
		name       string
		fenced     bool
		wantLanded bool
		wantErr    []error
	}{
		{name: "fenced: fails at the fence's close", fenced: true, wantErr: []error{errFenceClosed, errNotLeading, context.DeadlineExceeded}},
		{name: "unfenced: lands after a standby may lead", wantLanded: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			server := newHeldWrites()
			srv := httptest.NewServer(server)
			t.Cleanup(srv.Close)
			// Close waits on held writes: let them go first.
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(server.release) }) }
			t.Cleanup(release)
			mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{corev1.SchemeGroupVersion})
			mapper.Add(corev1.SchemeGroupVersion.WithKind("ConfigMap"), meta.RESTScopeNamespace)
			plain, err := client.New(&rest.Config{Host: srv.URL}, client.Options{Mapper: mapper})
			if err != nil {
				t.Fatal(err)
			}
			renewed := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			now := renewed
			var mu sync.Mutex
			clock := func() time.Time {
				mu.Lock()
				defer mu.Unlock()
				return now
			}
			lock := &fencedLock{Interface: &stubLock{}, now: clock}
			if err := lock.Create(t.Context(), resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			now = renewed.Add(renew - open)
			mu.Unlock()
			kc := client.Client(plain)
			if tt.fenced {
				kc = fencedClient{Client: plain, left: func() time.Duration { return lock.left(renew) }}
			}
			done := make(chan error, 1)
			go func() {
				done <- kc.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: "ns"}})
			}()
			within(t, server.arrived, "the write reaching the server")
			if tt.fenced {
				// The client gives the write up at the fence's close.
				within(t, server.abandoned, "the client giving up the held write")
			}
			// A standby may lead from here on; the server lets the write go.
			mu.Lock()
			now = renewed.Add(lease)
			mu.Unlock()
			release()
			var got error
			select {
			case got = <-done:
			case <-time.After(time.Minute):
				t.Fatal("the write was not answered within a minute")
			}
			landed := len(server.landed) == 1
			if landed != tt.wantLanded {
				t.Errorf("landed after a standby may lead: %v, want %v (error %v)", landed, tt.wantLanded, got)
			}
			for _, want := range tt.wantErr {
				if !errors.Is(got, want) {
					t.Errorf("error %v, want %v", got, want)
				}
			}
			if tt.wantErr == nil && got != nil {
				t.Errorf("error %v, want it to land", got)
			}
		})
	}
}

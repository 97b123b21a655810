package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	testclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/clocktest"
)

// renewServer is a fake orchestrator that answers every renewal with
// status (200 with a renewed lease, else an error body and, when
// retryAfter is set, Retry-After) and counts the renewals and polls.
type renewServer struct {
	srv        *httptest.Server
	status     atomic.Int32
	retryAfter int
	// code is the error body's code; default "test".
	code     string
	renewals atomic.Int32
	polls    atomic.Int32
	// polled gets a signal after each poll is counted.
	polled chan struct{}
}

func newRenewServer(t *testing.T, status, retryAfter int) *renewServer {
	t.Helper()
	rs := &renewServer{retryAfter: retryAfter, polled: make(chan struct{}, 1)}
	rs.status.Store(int32(status))
	rs.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == PathPoll {
			rs.polls.Add(1)
			select {
			case rs.polled <- struct{}{}:
			default:
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if !strings.HasSuffix(r.URL.Path, ":renew") {
			http.NotFound(w, r)
			return
		}
		rs.renewals.Add(1)
		w.Header().Set("Content-Type", "application/json")
		status := int(rs.status.Load())
		if status == http.StatusOK {
			_ = json.NewEncoder(w).Encode(RenewResponse{ExpiresAt: time.Now().Add(time.Minute)})
			return
		}
		if rs.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(rs.retryAfter))
		}
		w.WriteHeader(status)
		code := rs.code
		if code == "" {
			code = "test"
		}
		_ = json.NewEncoder(w).Encode(ErrorBody{Code: code, Message: "answered " + strconv.Itoa(status) + " by the test"})
	}))
	t.Cleanup(rs.srv.Close)
	return rs
}

func (rs *renewServer) client(t *testing.T) *Client {
	t.Helper()
	c, err := NewClient(ClientOptions{URL: rs.srv.URL, DispatcherID: "d-1", Transport: rs.srv.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// holdLeases makes s hold n running tasks whose leases of leaseSeconds are
// due for renewal now.
func holdLeases(s *Source, n, leaseSeconds int) []*task {
	var held []*task
	for i := range n {
		id := "t-" + strconv.Itoa(i)
		t, _ := s.leases.adopt(adoption{
			id: id, key: types.NamespacedName{Namespace: "runners", Name: "rw-" + id}, leaseID: "l-" + id, epoch: 1,
			seconds: leaseSeconds, // neither ended nor suspended: running
		}, s.clock.Now())
		held = append(held, t)
	}
	return held
}

// Renewals refused with 503 and Retry-After: 30 back off per lease: the
// next one waits Retry-After, though never longer than a third of the
// lease (the pace of renewals that succeed), instead of coming a second
// later. A renewal that succeeds puts the lease back on that pace.
func TestRenewalFailuresBackOff(t *testing.T) {
	t.Parallel()
	const leases = 5
	tests := []struct {
		name         string
		leaseSeconds int
		// want is how many renewals each lease gets in a minute: a second
		// apart (the code before), it would be 61.
		want int
	}{
		{name: "a Retry-After within a third of the lease is waited", leaseSeconds: 120, want: 3},  // at 0, 30 and 60 s
		{name: "a Retry-After past a third of the lease waits a third", leaseSeconds: 60, want: 4}, // at 0, 20, 40 and 60 s
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rs := newRenewServer(t, http.StatusServiceUnavailable, 30)
			clk := testclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			s := New(Options{
				Client: rs.client(t), Namespace: "runners", Options: runner.Options{Clock: clk},
				Backoff: Backoff{Base: time.Second, Max: time.Minute},
			})
			s.log = logr.Discard()
			held := holdLeases(s, leases, tt.leaseSeconds)
			r := newRenewals()
			for elapsed := time.Duration(0); elapsed <= time.Minute; elapsed += renewTick {
				s.renewDue(t.Context(), r)
				r.wg.Wait()
				clk.Step(renewTick)
			}
			if got, want := int(rs.renewals.Load()), leases*tt.want; got != want {
				t.Errorf("%d renewals of %d leases in a minute of 503s with Retry-After: 30, want %d", got, leases, want)
			}

			// The orchestrator is back: the next renewal succeeds, and the
			// one after comes a third of the lease later.
			rs.status.Store(http.StatusOK)
			v, _ := s.leases.view(held[0])
			clk.Step(v.renewAt.Sub(clk.Now()))
			s.renewDue(t.Context(), r)
			r.wg.Wait()
			v, _ = s.leases.view(held[0])
			if want := clk.Now().Add(renewInterval(tt.leaseSeconds)); !v.renewAt.Equal(want) {
				t.Errorf("after a renewal that succeeded, the next is due at %v, want %v", v.renewAt, want)
			}
			if v.renewFailures != 0 {
				t.Errorf("after a renewal that succeeded, %d failures are counted, want 0", v.renewFailures)
			}
		})
	}
}

// A renewal refused with 401 (twice: the client drops its token and tries
// once more), 403 or 426 stops the source with the orchestrator's answer,
// as a refused poll does; here the source is full, so it does not poll,
// and the renewal is what finds the refusal.
func TestRefusedRenewalStopsTheSource(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusUpgradeRequired} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			rs := newRenewServer(t, status, 0)
			s := New(Options{
				Client: rs.client(t), Kube: fake.NewClientBuilder().Build(), Namespace: "runners", Options: runner.Options{MaxConcurrent: 1},
			})
			s.log = logr.Discard()
			holdLeases(s, 1, 60)
			done := make(chan error, 1)
			go func() { done <- s.Start(t.Context()) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("the source still runs 30 s after renewals were answered %d (%d renewals)", status, rs.renewals.Load())
			}
			var oe *Error
			if !errors.As(err, &oe) || oe.Status != status || !strings.Contains(err.Error(), "refused this dispatcher") ||
				!strings.Contains(err.Error(), "by the test") {
				t.Errorf("the source stopped with %v, want the orchestrator's %d and its message", err, status)
			}
			want := int32(1)
			if status == http.StatusUnauthorized {
				want = 2
			}
			if n := rs.renewals.Load(); n != want {
				t.Errorf("%d renewals, want %d", n, want)
			}
			if n := rs.polls.Load(); n != 0 {
				t.Errorf("%d polls, want none (the source is full)", n)
			}
		})
	}
}

// A renewal refused 403 not-lease-holder (another dispatcher holds the
// lease) concerns that lease alone: the source does not stop, as it does on
// other 403s, nor retry it; it takes the lease as gone, waiting for the
// orchestrator to hand it back, and lets the task go if it does not. The
// lease gone, the full source polls again: that poll is what the test
// waits for.
func TestRenewalOfALeaseAnotherHoldsLetsItGo(t *testing.T) {
	t.Parallel()
	rs := newRenewServer(t, http.StatusForbidden, 0)
	rs.code = CodeNotLeaseHolder
	clk := clocktest.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := New(Options{
		Client: rs.client(t), Kube: fake.NewClientBuilder().Build(), Namespace: "runners", Options: runner.Options{MaxConcurrent: 1, Clock: clk},
	})
	s.log = logr.Discard()
	held := holdLeases(s, 1, 60)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	// The renewal loop's ticker, and the poll loop waiting for a slot.
	if err := clk.WaitForWaiters(2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := rs.polls.Load(); n != 0 {
		t.Fatalf("%d polls while the source is full, want none", n)
	}
	clk.Step(renewTick)
	select {
	case <-rs.polled:
	case err := <-done:
		t.Fatalf("the source stopped on a renewal answered 403 not-lease-holder: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatalf("no poll 30 s after the renewal was answered 403 not-lease-holder (%d renewals)", rs.renewals.Load())
	}
	if v, _ := s.leases.view(held[0]); !v.lost() {
		t.Error("the source polls again, yet the lease is not taken as gone")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("the source stopped with %v, want nil once cancelled", err)
	}
	if n := rs.renewals.Load(); n != 1 {
		t.Errorf("%d renewals, want 1: the refusal is not retried", n)
	}
	// With the renewal ended (Start waited for it), an hour on.
	if due := s.leases.due(clk.Now().Add(time.Hour)); len(due) != 0 {
		t.Errorf("%d leases due for renewal an hour on, want none: the refusal is not retried", len(due))
	}
}

package orchestratortest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/internal/clocktest"
)

func start(t *testing.T, opts Options) *Server {
	t.Helper()
	s := New(opts)
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// fakeClock is a clock a test steps, at a fixed start.
func fakeClock() *clocktest.Clock {
	return clocktest.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

// waitForTimer waits until something waits on clk (a held poll's timer),
// within a deadline.
func waitForTimer(t *testing.T, clk *clocktest.Clock) {
	t.Helper()
	if err := clk.WaitForWaiters(1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// waitHeld waits, within a deadline, until cond holds of s's counters as
// requests start and stop being held (Server.WaitHeld).
func waitHeld(t *testing.T, s *Server, what string, cond func(Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.WaitHeld(ctx, cond); err != nil {
		st := s.Stats()
		t.Fatalf("waiting for %s: %v (%d polls waiting, %d events held)", what, err, st.PollsWaiting, st.Held)
	}
}

// pollAsync polls in the background; the leases arrive on the channel.
func pollAsync(t *testing.T, s *Server, req orchestrator.PollRequest) <-chan []orchestrator.Lease {
	t.Helper()
	got := make(chan []orchestrator.Lease, 1)
	go func() {
		r, err := send(t.Context(), s, orchestrator.PathPoll, req, "")
		if err != nil || r.status == http.StatusNoContent {
			got <- nil
			return
		}
		var resp orchestrator.PollResponse
		_ = json.Unmarshal(r.body, &resp)
		got <- resp.Leases
	}()
	return got
}

// answer is what a poll started by pollAsync got, within a deadline.
func answer(t *testing.T, got <-chan []orchestrator.Lease) []orchestrator.Lease {
	t.Helper()
	select {
	case l := <-got:
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("the poll was not answered within 10 s")
		return nil
	}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

// errorCode is the code of an ErrorBody reply, "" if there is none.
func (r reply) errorCode() string {
	var e orchestrator.ErrorBody
	if json.Unmarshal(r.body, &e) != nil {
		return ""
	}
	return e.Code
}

// send posts body to path with the protocol header and, if not empty, a
// bearer token; it returns the transport error rather than failing.
func send(ctx context.Context, s *Server, path string, body any, bearer string) (reply, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return reply{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+path, bytes.NewReader(data))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set(orchestrator.HeaderProtocol, orchestrator.Version)
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := s.Client().Do(req)
	if err != nil {
		return reply{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, err
}

func post(t *testing.T, s *Server, path string, body any) reply {
	t.Helper()
	r, err := send(t.Context(), s, path, body, "")
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

func expect(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status || (code != "" && r.errorCode() != code) {
		t.Fatalf("got %d %s, want %d %s", r.status, r.body, status, code)
	}
}

func poll(t *testing.T, s *Server, req orchestrator.PollRequest) []orchestrator.Lease {
	t.Helper()
	r := post(t, s, orchestrator.PathPoll, req)
	if r.status == http.StatusNoContent {
		return nil
	}
	expect(t, r, http.StatusOK, "")
	var resp orchestrator.PollResponse
	if err := json.Unmarshal(r.body, &resp); err != nil {
		t.Fatal(err)
	}
	return resp.Leases
}

func event(id string, epoch int64, typ orchestrator.EventType) orchestrator.Event {
	key := id + "/" + string(typ)
	if typ.Final() {
		key = id + "/final"
	}
	return orchestrator.Event{IdempotencyKey: key, Epoch: epoch, Type: typ, Time: time.Now()}
}

func tasks(ids ...string) []orchestrator.Task {
	out := make([]orchestrator.Task, len(ids))
	for i, id := range ids {
		out[i] = orchestrator.Task{ID: id, Image: "runner:1", Args: []string{"apply"}}
	}
	return out
}

func leaseTasks(leases []orchestrator.Lease) []string {
	var ids []string
	for _, l := range leases {
		ids = append(ids, l.Task.ID)
	}
	return ids
}

func TestPollHandsOutAtMostFreeInOrder(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	s.Add(tasks("t-1", "t-2", "t-3", "t-4", "t-5")...)

	got := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 3, Max: 3}})
	if ids := leaseTasks(got); !slices.Equal(ids, []string{"t-1", "t-2", "t-3"}) {
		t.Fatalf("leased %v, want t-1..t-3", ids)
	}
	for _, l := range got {
		if l.Epoch != 1 || l.LeaseSeconds != 60 || l.LeaseID == "" || time.Until(l.ExpiresAt) < 59*time.Second {
			t.Errorf("lease %+v", l)
		}
	}
	if got := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Max: 3}}); len(got) != 0 {
		t.Errorf("poll with no free capacity got %d leases", len(got))
	}
	if got := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-2", Capacity: orchestrator.Capacity{Free: 8, Max: 8}}); len(got) != 2 {
		t.Errorf("got %d leases, want the 2 left", len(got))
	}
	polls := s.Polls()
	if len(polls) != 3 || polls[0].New != 3 || polls[1].New != 0 || polls[1].Capacity.Free != 0 || polls[2].New != 2 {
		t.Errorf("polls %+v", polls)
	}
	if rec := s.Task("t-1"); len(rec.Leases) != 1 || !rec.Leased || rec.Holder != "d-1" || rec.Queued {
		t.Errorf("t-1 %+v", rec)
	}
	if st := s.Stats(); st.CapacityViolations != 0 || st.LeasesIssued != 5 || st.Requests[EndpointPoll] != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestConcurrentPollersNeverExceedCapacity(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	var ids []string
	for i := range 40 {
		ids = append(ids, fmt.Sprintf("t-%d", i))
	}
	s.Add(tasks(ids...)...)
	var wg sync.WaitGroup
	for d := range 4 {
		wg.Go(func() {
			for range 6 {
				leases := poll(t, s, orchestrator.PollRequest{
					DispatcherID: fmt.Sprintf("d-%d", d), Capacity: orchestrator.Capacity{Free: 2, Max: 2},
				})
				if len(leases) > 2 {
					t.Errorf("poll got %d leases", len(leases))
				}
			}
		})
	}
	wg.Wait()
	for _, rec := range s.Tasks() {
		if len(rec.Leases) != 1 {
			t.Errorf("task %s leased %d times", rec.Task.ID, len(rec.Leases))
		}
	}
	if st := s.Stats(); st.LeasesIssued != 40 || st.CapacityViolations != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestPollIsHeldUntilATaskArrives(t *testing.T) {
	t.Parallel()
	clk := fakeClock()
	s := start(t, Options{MaxWait: 200 * time.Millisecond, Clock: clk})

	held := pollAsync(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}, WaitSeconds: 30})
	waitForTimer(t, clk)
	clk.Step(199 * time.Millisecond)
	select {
	case got := <-held:
		t.Fatalf("the poll was answered %v before MaxWait", got)
	default:
	}
	clk.Step(time.Millisecond)
	if got := answer(t, held); got != nil {
		t.Fatalf("got %v from an empty queue", got)
	}

	held = pollAsync(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}, WaitSeconds: 1})
	waitForTimer(t, clk)
	s.Add(tasks("t-1")...)
	if got := answer(t, held); len(got) != 1 {
		t.Fatalf("held poll got %d leases", len(got))
	}

	// A held poll whose client goes away ends then, not when its clock
	// runs out (the clock does not move), and hands out nothing. What the
	// client's own call returns is net/http's business: a response that
	// races the cancellation may reach it.
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_, _ = send(ctx, s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}, WaitSeconds: 1}, "")
	}()
	waitPolls := func(n int) {
		t.Helper()
		waitHeld(t, s, fmt.Sprintf("%d polls waiting", n), func(st Stats) bool { return st.PollsWaiting == n })
	}
	waitForTimer(t, clk)
	waitPolls(1) // held: counted once its timer is made
	cancel()
	<-gone
	waitPolls(0)
	// t-2 goes to the next poll, not to the one whose client left.
	s.Add(tasks("t-2")...)
	if got := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-2", Capacity: orchestrator.Capacity{Free: 1, Max: 1}}); len(got) != 1 || got[0].Task.ID != "t-2" {
		t.Errorf("a poll after the gone one got %v, want t-2", got)
	}
	if rec := s.Task("t-2"); len(rec.Leases) != 1 {
		t.Errorf("t-2 leased %d times, want once", len(rec.Leases))
	}
}

func TestCloseEndsHeldPolls(t *testing.T) {
	t.Parallel()
	clk := fakeClock()
	s := New(Options{Clock: clk})
	s.Start()
	done := make(chan reply, 1)
	go func() {
		r, _ := send(context.Background(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", WaitSeconds: 30}, "")
		done <- r
	}()
	// The poll is held: it waits on the clock, which never moves.
	waitForTimer(t, clk)
	began := time.Now()
	s.Close()
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	<-done
}

func TestExpiredLeaseIsRequeuedAndReissued(t *testing.T) {
	t.Parallel()
	clk := fakeClock()
	s := start(t, Options{LeaseSeconds: 1, Clock: clk})
	s.Add(tasks("t-1", "t-2")...)
	first := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 2, Max: 2}})
	if len(first) != 2 {
		t.Fatalf("got %d leases", len(first))
	}

	// A poll with no free capacity is held until the leases expire, then
	// gets back t-1, which it runs, but not t-2.
	held := pollAsync(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Max: 2}, Running: []string{"t-1"}, WaitSeconds: 5})
	waitForTimer(t, clk)
	clk.Step(time.Second + expiryMargin)
	again := answer(t, held)
	if len(again) != 1 || again[0].Task.ID != "t-1" || again[0].Epoch != 2 || again[0].LeaseID == first[0].LeaseID {
		t.Fatalf("re-issued %+v, want t-1 at epoch 2 with a new lease ID", again)
	}
	rec := s.Task("t-1")
	if len(rec.Leases) != 2 || !rec.Leases[1].Reissued || rec.Requeues != 1 || rec.Epoch != 2 {
		t.Errorf("t-1 %+v", rec)
	}

	// t-2 went back to the queue and goes to whoever has room, at epoch 2.
	if rec := s.Task("t-2"); !rec.Queued || rec.Leased {
		t.Errorf("t-2 %+v", rec)
	}
	other := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-2", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})
	if len(other) != 1 || other[0].Task.ID != "t-2" || other[0].Epoch != 2 {
		t.Fatalf("d-2 got %+v", other)
	}

	// The old holder's lease is gone and its epoch stale.
	expect(t, post(t, s, orchestrator.PathRenew(first[1].LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: 1}), http.StatusGone, orchestrator.CodeGone)
	expect(t, post(t, s, orchestrator.PathEvents("t-2"), event("t-2", 1, orchestrator.EventRunning)), http.StatusConflict, orchestrator.CodeStaleLease)
	expect(t, post(t, s, orchestrator.PathLogs("t-2"), orchestrator.LogChunk{Epoch: 1, Data: []byte("x")}), http.StatusConflict, orchestrator.CodeStaleLease)
	expect(t, post(t, s, orchestrator.PathEvents("t-2"), event("t-2", 2, orchestrator.EventRunning)), http.StatusOK, "")
	if rec := s.Task("t-2"); rec.Stale != 2 || len(rec.Events) != 1 || len(rec.Log) != 0 {
		t.Errorf("t-2 %+v", rec)
	}
	if st := s.Stats(); st.Requeues != 2 || st.Reissued != 1 || st.LeasesIssued != 4 {
		t.Errorf("stats %+v", st)
	}
}

func TestFinalEventOnExpiredLeaseIsAccepted(t *testing.T) {
	t.Parallel()
	clk := fakeClock()
	s := start(t, Options{LeaseSeconds: 1, Clock: clk})
	s.Add(tasks("t-1")...)
	l := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})[0]
	clk.Step(1100 * time.Millisecond)
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventSucceeded)), http.StatusOK, "")
	if rec := s.Task("t-1"); rec.Queued || rec.Leased || !rec.Done() || rec.Requeues != 1 {
		t.Errorf("t-1 %+v", rec)
	}
	if got := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}, Running: []string{"t-1"}}); got != nil {
		t.Errorf("finished task handed out again: %+v", got)
	}
}

// A final event stored under a re-issued lease is answered as stored when
// it comes again with the older epoch (from a dispatcher whose Job still
// records the first lease), and is not stored twice; an event not stored
// yet with that epoch is refused as stale.
func TestRepeatWithAnOlderEpochIsAnsweredAsStored(t *testing.T) {
	t.Parallel()
	s := start(t, Options{LeaseSeconds: 1})
	s.Add(tasks("t-1")...)
	first := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})
	if len(first) != 1 {
		t.Fatalf("%d leases", len(first))
	}
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventJobCreated)), http.StatusOK, "")
	again := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Max: 1}, Running: []string{"t-1"}, WaitSeconds: 5})
	if len(again) != 1 || again[0].Epoch != 2 {
		t.Fatalf("re-issued %+v, want t-1 at epoch 2", again)
	}
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 2, orchestrator.EventSucceeded)), http.StatusOK, "")

	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventSucceeded)), http.StatusOK, "")
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventJobCreated)), http.StatusOK, "")
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventRunning)), http.StatusConflict, orchestrator.CodeStaleLease)
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 3, orchestrator.EventSucceeded)), http.StatusBadRequest, orchestrator.CodeBadRequest)
	rec := s.Task("t-1")
	if rec.FinalStored != 1 || rec.Final == nil || rec.Final.Epoch != 2 || rec.Repeats != 2 || rec.Stale != 1 || len(rec.Events) != 2 {
		t.Errorf("t-1 %+v, want the final stored once under epoch 2, two repeats and one stale event", rec)
	}
}

func TestRenew(t *testing.T) {
	t.Parallel()
	s := start(t, Options{LeaseSeconds: 30})
	s.Add(tasks("t-1")...)
	l := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})[0]

	r := post(t, s, orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: l.Epoch})
	expect(t, r, http.StatusOK, "")
	var resp orchestrator.RenewResponse
	if err := json.Unmarshal(r.body, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Cancel || resp.ExpiresAt.Before(l.ExpiresAt) {
		t.Errorf("renewal %+v of %+v", resp, l)
	}

	s.Cancel("t-1", "cancelled by alice")
	r = post(t, s, orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: l.Epoch})
	expect(t, r, http.StatusOK, "")
	if err := json.Unmarshal(r.body, &resp); err != nil {
		t.Fatal(err)
	}
	if !resp.Cancel || resp.CancelReason != "cancelled by alice" {
		t.Errorf("renewal %+v, want cancel", resp)
	}

	expect(t, post(t, s, orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: 7}), http.StatusConflict, orchestrator.CodeStaleLease)
	expect(t, post(t, s, orchestrator.PathRenew("l-nope"), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: 1}), http.StatusGone, orchestrator.CodeGone)

	// The final event ends the lease.
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventCancelled)), http.StatusOK, "")
	expect(t, post(t, s, orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: l.Epoch}), http.StatusGone, orchestrator.CodeGone)
	if rec := s.Task("t-1"); rec.Renewals != 2 || !rec.Cancelled || rec.Leased || rec.Final == nil || rec.Final.Type != orchestrator.EventCancelled {
		t.Errorf("t-1 %+v", rec)
	}
}

func TestCancelBeforeLease(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	s.Add(tasks("t-1", "t-2")...)
	s.Cancel("t-1", "not needed")
	got := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 2, Max: 2}})
	if ids := leaseTasks(got); !slices.Equal(ids, []string{"t-2"}) {
		t.Errorf("leased %v, want t-2 only", ids)
	}
	if rec := s.Task("t-1"); !rec.Cancelled || rec.Queued || len(rec.Leases) != 0 || !rec.EndedByOrchestrator ||
		rec.Final == nil || rec.Final.Type != orchestrator.EventCancelled || rec.FinalStored != 1 {
		t.Errorf("t-1 %+v, want ended by the orchestrator, cancelled", rec)
	}
}

// A cancel always ends its task. A cancelled task whose lease expired
// (its lease response was lost, or its dispatcher stopped before its Job
// existed) is handed back to a dispatcher that lists it as running, which
// then learns of the cancel; if none does for a lease duration, the
// orchestrator ends it itself.
func TestCancelOfAnUnheldTaskEndsIt(t *testing.T) {
	t.Parallel()
	clk := fakeClock()
	s := start(t, Options{LeaseSeconds: 1, Clock: clk})
	s.Add(tasks("lost", "held")...)
	leases := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 2, Max: 2}})
	if len(leases) != 2 {
		t.Fatalf("%d leases", len(leases))
	}
	s.Cancel("lost", "stop")
	s.Cancel("held", "stop")
	clk.Step(1100 * time.Millisecond) // both leases expire
	// The dispatcher still runs "held": it is handed back, and the renewal
	// says cancel.
	again := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Running: []string{"held"}, Capacity: orchestrator.Capacity{Free: 0, Max: 2}})
	if ids := leaseTasks(again); !slices.Equal(ids, []string{"held"}) {
		t.Fatalf("re-issued %v, want held", ids)
	}
	r := post(t, s, orchestrator.PathRenew(again[0].LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: again[0].Epoch})
	var resp orchestrator.RenewResponse
	if err := json.Unmarshal(r.body, &resp); err != nil || !resp.Cancel {
		t.Fatalf("renewal of the handed-back lease: %+v, %v; want cancel", resp, err)
	}
	if rec := s.Task("lost"); rec.Final != nil {
		t.Fatalf("lost ended before a lease duration without a holder: %+v", rec.Final)
	}
	clk.Step(1100 * time.Millisecond)
	poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Running: []string{"held"}, Capacity: orchestrator.Capacity{Free: 0, Max: 2}})
	rec := s.Task("lost")
	if !rec.EndedByOrchestrator || rec.Final == nil || rec.Final.Type != orchestrator.EventCancelled || rec.FinalStored != 1 || rec.Queued {
		t.Errorf("lost %+v, want ended by the orchestrator, cancelled", rec)
	}
	if held := s.Task("held"); held.EndedByOrchestrator || held.Final != nil {
		t.Errorf("held %+v: its dispatcher reports it", held)
	}
}

func TestEventsAreStoredOnce(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	s.Add(tasks("t-1")...)
	l := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})[0]

	created := event("t-1", 1, orchestrator.EventJobCreated)
	created.JobName = "rw-t-1"
	for range 3 {
		expect(t, post(t, s, orchestrator.PathEvents("t-1"), created), http.StatusOK, "")
	}
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventRunning)), http.StatusOK, "")
	code := int32(2)
	failed := event("t-1", 1, orchestrator.EventFailed)
	failed.Reason, failed.ExitCode = "NonZeroExit", &code
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), failed), http.StatusOK, "")
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), failed), http.StatusOK, "")
	// Another outcome under the same key is answered the same and not
	// stored.
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventSucceeded)), http.StatusOK, "")
	// A final event under another key is stored, and shows in FinalStored.
	wrongKey := event("t-1", 1, orchestrator.EventSucceeded)
	wrongKey.IdempotencyKey = "t-1/1/succeeded"
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), wrongKey), http.StatusOK, "")

	rec := s.Task("t-1")
	types := make([]orchestrator.EventType, len(rec.Events))
	for i, e := range rec.Events {
		types[i] = e.Type
	}
	want := []orchestrator.EventType{orchestrator.EventJobCreated, orchestrator.EventRunning, orchestrator.EventFailed, orchestrator.EventSucceeded}
	if !slices.Equal(types, want) {
		t.Errorf("stored %v, want %v", types, want)
	}
	if rec.Repeats != 4 || rec.RepeatConflicts != 1 || rec.FinalStored != 2 || rec.FinalPosts != 4 || rec.EventPosts != 8 || rec.BadKeys != 1 {
		t.Errorf("t-1 %+v", rec)
	}
	if rec.Final == nil || rec.Final.Type != orchestrator.EventFailed || *rec.Final.ExitCode != 2 || rec.Events[0].JobName != "rw-t-1" {
		t.Errorf("final %+v", rec.Final)
	}
	if s.Done() != 1 {
		t.Errorf("Done %d", s.Done())
	}
	expect(t, post(t, s, orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: 1}), http.StatusGone, orchestrator.CodeGone)
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	s.Add(tasks("t-1")...)
	poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL()+orchestrator.PathPoll, bytes.NewReader([]byte("{not json")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(orchestrator.HeaderProtocol, orchestrator.Version)
	resp, err := s.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed JSON: %d", resp.StatusCode)
	}

	expect(t, post(t, s, orchestrator.PathEvents("t-9"), event("t-9", 1, orchestrator.EventRunning)), http.StatusNotFound, "")
	expect(t, post(t, s, orchestrator.PathLogs("t-9"), orchestrator.LogChunk{Epoch: 1}), http.StatusNotFound, "")
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, "accepted")), http.StatusBadRequest, orchestrator.CodeBadRequest)
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 2, orchestrator.EventRunning)), http.StatusBadRequest, orchestrator.CodeBadRequest)
	expect(t, post(t, s, orchestrator.PathPoll, orchestrator.PollRequest{}), http.StatusBadRequest, orchestrator.CodeBadRequest)
	expect(t, post(t, s, "/v1/nothing", struct{}{}), http.StatusNotFound, "")
	if st := s.Stats(); st.Requests[EndpointOther] != 1 || st.Statuses[http.StatusBadRequest] != 4 {
		t.Errorf("stats %+v", st)
	}
}

func TestLogsAreStoredByByteRange(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	s.Add(tasks("t-1")...)
	poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})
	chunk := func(offset int64, data string, final bool) orchestrator.LogChunk {
		return orchestrator.LogChunk{IdempotencyKey: fmt.Sprintf("t-1/log/%d", offset), Epoch: 1, Offset: offset, Data: []byte(data), Final: final}
	}
	path := orchestrator.PathLogs("t-1")
	expect(t, post(t, s, path, chunk(0, "hello ", false)), http.StatusOK, "")
	expect(t, post(t, s, path, chunk(0, "hello ", false)), http.StatusOK, "")   // sent again
	expect(t, post(t, s, path, chunk(3, "lo world", false)), http.StatusOK, "") // overlapping
	expect(t, post(t, s, path, chunk(20, "later", false)), http.StatusConflict, orchestrator.CodeLogGap)
	expect(t, post(t, s, path, chunk(11, "", false)), http.StatusOK, "")       // empty, at the end
	expect(t, post(t, s, path, chunk(6, "world!\n", true)), http.StatusOK, "") // overlapping, final
	big := orchestrator.LogChunk{Epoch: 1, Offset: 0, Data: make([]byte, orchestrator.MaxLogChunk+1)}
	expect(t, post(t, s, path, big), http.StatusBadRequest, orchestrator.CodeBadRequest)

	rec := s.Task("t-1")
	if string(rec.Log) != "hello world!\n" || !rec.LogFinal || rec.LogPosts != 7 || rec.LogGaps != 1 {
		t.Errorf("log %q final %v posts %d gaps %d", rec.Log, rec.LogFinal, rec.LogPosts, rec.LogGaps)
	}
}

func TestVersionIsRequired(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	for _, version := range []string{"", "2"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL()+orchestrator.PathPoll, bytes.NewReader([]byte(`{}`)))
		if err != nil {
			t.Fatal(err)
		}
		if version != "" {
			req.Header.Set(orchestrator.HeaderProtocol, version)
		}
		resp, err := s.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body orchestrator.ErrorBody
		err = json.NewDecoder(resp.Body).Decode(&body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusUpgradeRequired || body.Code != orchestrator.CodeVersion || body.Message != "supported protocol versions: 1" {
			t.Errorf("version %q: %d %+v %v", version, resp.StatusCode, body, err)
		}
	}
	if st := s.Stats(); st.UnsupportedVersion != 2 {
		t.Errorf("stats %+v", st)
	}
}

func signJWT(t *testing.T, key ed25519.PrivateKey, alg jwa.SignatureAlgorithm, aud string, iat, exp time.Time, sub string) string {
	t.Helper()
	b := jwt.NewBuilder().Issuer(sub).Subject(sub).Audience([]string{aud}).Expiration(exp).JwtID(rand.Text())
	if !iat.IsZero() {
		b = b.IssuedAt(iat)
	}
	tok, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	jk, err := jwk.Import(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := jk.Set(jwk.KeyIDKey, "runner-1"); err != nil {
		t.Fatal(err)
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(alg, jk))
	if err != nil {
		t.Fatal(err)
	}
	return string(signed)
}

func TestJWTAuthentication(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, Options{Dispatchers: []Dispatcher{{ID: "d-1", KeyID: "runner-1", PublicKey: pub}}})
	now := time.Now()
	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"valid", signJWT(t, priv, jwa.EdDSA(), s.URL(), now, now.Add(time.Minute), "d-1"), true},
		{"none", "", false},
		{"not a JWT", "abc", false},
		{"expired", signJWT(t, priv, jwa.EdDSA(), s.URL(), now.Add(-2*time.Minute), now.Add(-time.Minute), "d-1"), false},
		{"too long-lived", signJWT(t, priv, jwa.EdDSA(), s.URL(), now, now.Add(10*time.Minute), "d-1"), false},
		{"no iat", signJWT(t, priv, jwa.EdDSA(), s.URL(), time.Time{}, now.Add(time.Minute), "d-1"), false},
		{"wrong key", signJWT(t, otherKey, jwa.EdDSA(), s.URL(), now, now.Add(time.Minute), "d-1"), false},
		{"wrong aud", signJWT(t, priv, jwa.EdDSA(), "https://elsewhere.example", now, now.Add(time.Minute), "d-1"), false},
		{"no sub", signJWT(t, priv, jwa.EdDSA(), s.URL(), now, now.Add(time.Minute), ""), false},
		{"alg Ed25519", signJWT(t, priv, jwa.EdDSAEd25519(), s.URL(), now, now.Add(time.Minute), "d-1"), false},
	}
	for _, tt := range tests {
		r, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}, tt.token)
		if err != nil {
			t.Fatal(err)
		}
		if tt.ok {
			if r.status != http.StatusNoContent {
				t.Errorf("%s: %d %s", tt.name, r.status, r.body)
			}
		} else if r.status != http.StatusUnauthorized || r.errorCode() != orchestrator.CodeUnauthorized {
			t.Errorf("%s: %d %s, want 401", tt.name, r.status, r.body)
		}
	}
}

func TestStaticToken(t *testing.T) {
	t.Parallel()
	s := start(t, Options{Token: "s3cret", DispatcherID: "d-1"})
	for token, status := range map[string]int{"s3cret": http.StatusNoContent, "": http.StatusUnauthorized, "wrong": http.StatusUnauthorized} {
		r, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}, token)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != status {
			t.Errorf("token %q: %d %s, want %d", token, r.status, r.body, status)
		}
	}
}

func TestTokenExchange(t *testing.T) {
	t.Parallel()
	clk := fakeClock()
	s := start(t, Options{ServiceAccountToken: "sa-token", DispatcherID: "d-1", ExchangeTTL: 300 * time.Millisecond, Clock: clk})

	expect(t, post(t, s, orchestrator.PathToken, orchestrator.TokenRequest{Token: "other"}), http.StatusUnauthorized, orchestrator.CodeUnauthorized)
	r := post(t, s, orchestrator.PathToken, orchestrator.TokenRequest{Token: "sa-token"})
	expect(t, r, http.StatusOK, "")
	var tok orchestrator.TokenResponse
	if err := json.Unmarshal(r.body, &tok); err != nil {
		t.Fatal(err)
	}
	if tok.AccessToken == "" || tok.TokenType != "Bearer" || tok.ExpiresIn != 1 {
		t.Fatalf("token %+v", tok)
	}
	check := func(token string, status int) {
		t.Helper()
		r, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}, token)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != status {
			t.Errorf("token %q: %d %s, want %d", token, r.status, r.body, status)
		}
	}
	check(tok.AccessToken, http.StatusNoContent)
	check("sa-token", http.StatusUnauthorized)
	check("", http.StatusUnauthorized)
	clk.Step(299 * time.Millisecond)
	check(tok.AccessToken, http.StatusNoContent)
	clk.Step(time.Millisecond)
	check(tok.AccessToken, http.StatusUnauthorized)
}

func TestCAFile(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	path, err := s.CAFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("no certificate in %s", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}

	// A client trusting only that file reaches the server.
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		t.Fatal("no certificate added")
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL()+orchestrator.PathPoll,
		bytes.NewReader([]byte(`{"dispatcherId": "d-1", "capacity": {"free": 0, "max": 1}}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(orchestrator.HeaderProtocol, orchestrator.Version)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("status %d", resp.StatusCode)
	}
}

func TestFaultUnreachable(t *testing.T) {
	t.Parallel()
	clk := fakeClock()
	s := start(t, Options{Faults: Faults{Unreachable: true}, Clock: clk})
	if _, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}, ""); err == nil {
		t.Error("unreachable server answered")
	}
	s.SetFaults(Faults{UnreachableUntil: clk.Now().Add(100 * time.Millisecond)})
	if _, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}, ""); err == nil {
		t.Error("unreachable server answered")
	}
	clk.Step(100 * time.Millisecond)
	expect(t, post(t, s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}), http.StatusNoContent, "")
	if st := s.Stats(); st.Unreachable != 2 || st.Requests[EndpointPoll] != 3 || st.Statuses[http.StatusNoContent] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestFaultErrors(t *testing.T) {
	t.Parallel()
	s := start(t, Options{Faults: Faults{ErrorBurst: 2, RetryAfter: time.Second}})
	s.Add(tasks("t-1")...)
	pollReq := orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}}
	for range 2 {
		r := post(t, s, orchestrator.PathPoll, pollReq)
		expect(t, r, http.StatusServiceUnavailable, "")
		if got := r.header.Get("Retry-After"); got != "1" {
			t.Errorf("Retry-After %q", got)
		}
	}
	if f := s.Faults(); f.ErrorBurst != 0 {
		t.Errorf("burst left %d", f.ErrorBurst)
	}
	if got := poll(t, s, pollReq); len(got) != 1 {
		t.Fatalf("after the burst got %d leases", len(got))
	}

	// Errors limited to events, without Retry-After; 503s change nothing.
	s.SetFaults(Faults{ErrorRate: 1, Endpoints: []Endpoint{EndpointEvents}})
	r := post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventRunning))
	expect(t, r, http.StatusServiceUnavailable, "")
	if r.header.Get("Retry-After") != "" {
		t.Errorf("Retry-After %q", r.header.Get("Retry-After"))
	}
	expect(t, post(t, s, orchestrator.PathLogs("t-1"), orchestrator.LogChunk{Epoch: 1, Data: []byte("x")}), http.StatusOK, "")
	if rec := s.Task("t-1"); len(rec.Events) != 0 || rec.EventPosts != 0 {
		t.Errorf("t-1 %+v", rec)
	}
	if st := s.Stats(); st.InjectedErrors != 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestFaultDroppedResponse(t *testing.T) {
	t.Parallel()
	s := start(t, Options{})
	s.Add(tasks("t-1")...)
	poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})

	s.SetFaults(Faults{DropResponseRate: 1, Endpoints: []Endpoint{EndpointEvents}})
	final := event("t-1", 1, orchestrator.EventSucceeded)
	if _, err := send(t.Context(), s, orchestrator.PathEvents("t-1"), final, ""); err == nil {
		t.Fatal("dropped response arrived")
	}
	if rec := s.Task("t-1"); rec.Final == nil {
		t.Fatal("the request whose response was dropped was not processed")
	}
	s.SetFaults(Faults{})
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), final), http.StatusOK, "")
	if rec := s.Task("t-1"); rec.FinalStored != 1 || rec.FinalPosts != 2 || rec.Repeats != 1 {
		t.Errorf("t-1 %+v", rec)
	}

	// A dropped poll response loses the lease; the task comes back when it
	// expires.
	s.Add(tasks("t-2")...)
	s.SetFaults(Faults{DropResponseRate: 1})
	if _, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}}, ""); err == nil {
		t.Fatal("dropped response arrived")
	}
	if rec := s.Task("t-2"); !rec.Leased || len(rec.Leases) != 1 {
		t.Errorf("t-2 %+v", rec)
	}
	if st := s.Stats(); st.DroppedResponses != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestFaultDuplicateLeases(t *testing.T) {
	t.Parallel()
	s := start(t, Options{Faults: Faults{DuplicateLeaseRate: 1}})
	s.Add(tasks("t-1", "t-2", "t-3")...)
	got := poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 3}})
	if len(got) != 2 || !leaseEqual(got[0], got[1]) {
		t.Fatalf("got %+v, want one lease twice", got)
	}

	s.SetFaults(Faults{DuplicateLeaseRate: 1, DuplicateNextPoll: true})
	got = poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 3}})
	if len(got) != 1 || got[0].Task.ID != "t-2" {
		t.Fatalf("got %+v, want t-2 once", got)
	}
	first := got[0]
	s.SetFaults(Faults{})
	got = poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Max: 3}})
	if len(got) != 1 || !leaseEqual(got[0], first) {
		t.Fatalf("got %+v, want t-2's lease again", got)
	}
	if rec := s.Task("t-2"); len(rec.Leases) != 1 {
		t.Errorf("t-2 %+v", rec)
	}
	if st := s.Stats(); st.DuplicateLeases != 2 || st.LeasesIssued != 2 || st.CapacityViolations != 0 {
		t.Errorf("stats %+v", st)
	}
	if polls := s.Polls(); polls[2].Duplicates != 1 || polls[2].New != 0 {
		t.Errorf("polls %+v", polls)
	}
}

func leaseEqual(a, b orchestrator.Lease) bool {
	return a.LeaseID == b.LeaseID && a.Epoch == b.Epoch && a.ExpiresAt.Equal(b.ExpiresAt) && a.Task.ID == b.Task.ID
}

func TestFaultHold(t *testing.T) {
	t.Parallel()
	s := start(t, Options{Faults: Faults{Hold: []orchestrator.EventType{orchestrator.EventJobCreated}}})
	s.Add(tasks("t-1")...)
	poll(t, s, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})

	created := event("t-1", 1, orchestrator.EventJobCreated)
	errs := make(chan error, 1)
	go func() {
		_, err := send(context.Background(), s, orchestrator.PathEvents("t-1"), created, "")
		errs <- err
	}()
	waitHeld(t, s, "the job-created event held", func(st Stats) bool { return st.Held == 1 })
	// Other types pass.
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventRunning)), http.StatusOK, "")
	select {
	case err := <-errs:
		t.Fatalf("held request ended before Release: %v", err)
	default:
	}
	s.Release()
	if err := <-errs; err == nil {
		t.Error("released request was answered")
	}
	if rec := s.Task("t-1"); len(rec.Events) != 1 || rec.EventPosts != 1 {
		t.Errorf("the held event was processed: %+v", rec)
	}

	// A client that gives up ends its held request.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		_, err := send(ctx, s, orchestrator.PathEvents("t-1"), created, "")
		errs <- err
	}()
	waitHeld(t, s, "the second job-created event held", func(st Stats) bool { return st.Held == 2 })
	cancel()
	if err := <-errs; err == nil {
		t.Error("held request was answered")
	}

	s.SetFaults(Faults{})
	expect(t, post(t, s, orchestrator.PathEvents("t-1"), created), http.StatusOK, "")
	if st := s.Stats(); st.Held != 2 {
		t.Errorf("stats %+v", st)
	}
}

// TestJWTClockSkew: the test orchestrator checks iat, nbf and exp strictly
// against its own clock; the dispatcher's tokens (backdated by
// orchestrator.JWTSkew) are taken from a dispatcher whose clock is up to that
// far ahead, or behind, and refused beyond it.
func TestJWTClockSkew(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, Options{PublicKey: pub})
	tests := []struct {
		name string
		skew time.Duration
		ok   bool
	}{
		{"same clock", 0, true},
		{"2s ahead", 2 * time.Second, true},
		{"55s ahead", 55 * time.Second, true},
		{"2m behind", -2 * time.Minute, true},
		{"90s ahead", 90 * time.Second, false},
		{"5m behind", -5 * time.Minute, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := &orchestrator.JWT{Key: priv, Subject: "d-1", Audience: s.URL(), Now: func() time.Time { return time.Now().Add(tt.skew) }}
			tok, err := a.Token(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			r, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}, tok)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.status == http.StatusNoContent; got != tt.ok {
				t.Errorf("dispatcher clock %v off: %d %s, want accepted %v", tt.skew, r.status, r.body, tt.ok)
			}
		})
	}
}

// TestOverDeliverAndRelease: the OverDeliver fault hands out more than the
// poll asked for (counted as a capacity violation); a released lease's task
// goes back to the queue at once, and the lease is gone.
func TestOverDeliverAndRelease(t *testing.T) {
	t.Parallel()
	s := start(t, Options{Faults: Faults{OverDeliver: 1}})
	s.Add(orchestrator.Task{ID: "t-1"}, orchestrator.Task{ID: "t-2"})
	r, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}}, "")
	if err != nil {
		t.Fatal(err)
	}
	var got orchestrator.PollResponse
	if err := json.Unmarshal(r.body, &got); err != nil || len(got.Leases) != 2 || s.Stats().CapacityViolations != 1 {
		t.Fatalf("poll: %d %s (%v), %d violations; want 2 leases, 1 violation", r.status, r.body, err, s.Stats().CapacityViolations)
	}
	extra := got.Leases[1]
	path := orchestrator.PathRelease(extra.LeaseID)
	if r, err := send(t.Context(), s, path, orchestrator.ReleaseRequest{DispatcherID: "d-1", Epoch: extra.Epoch + 1}, ""); err != nil || r.status != http.StatusConflict {
		t.Errorf("release with another epoch: %d %s (%v), want 409", r.status, r.body, err)
	}
	if r, err := send(t.Context(), s, path, orchestrator.ReleaseRequest{DispatcherID: "d-1", Epoch: extra.Epoch}, ""); err != nil || r.status != http.StatusNoContent {
		t.Fatalf("release: %d %s (%v), want 204", r.status, r.body, err)
	}
	if rec := s.Task(extra.Task.ID); rec.Releases != 1 || !rec.Queued || rec.Leased {
		t.Errorf("released task: %+v, want queued again", rec)
	}
	if r, err := send(t.Context(), s, path, orchestrator.ReleaseRequest{DispatcherID: "d-1", Epoch: extra.Epoch}, ""); err != nil || r.status != http.StatusGone {
		t.Errorf("second release: %d %s (%v), want 410", r.status, r.body, err)
	}
}

// as posts body to path as dispatcher sub, with a JWT of its own for the
// request, as the dispatcher signs them (kid sub, the default).
func as(t *testing.T, s *Server, key ed25519.PrivateKey, sub, path string, body any) reply {
	t.Helper()
	tok, err := (&orchestrator.JWT{Key: key, Subject: sub, Audience: s.URL()}).Token(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r, err := send(t.Context(), s, path, body, tok)
	if err != nil {
		t.Fatalf("POST %s as %s: %v", path, sub, err)
	}
	return r
}

// TestLeaseIsBoundToItsHolder: a lease is the dispatcher's that polled for
// it. Another authenticated dispatcher that knows its ID and epoch cannot
// poll in its name (to be re-issued its tasks), renew or release it, nor
// report an event or log chunk under it, a final event or a repeat of one
// included: 403 not-lease-holder, nothing stored. The holder's own path is
// unaffected.
func TestLeaseIsBoundToItsHolder(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub2, priv2, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, Options{Dispatchers: []Dispatcher{{ID: "d-1", PublicKey: pub}, {ID: "d-2", PublicKey: pub2}}})
	s.Add(tasks("t-1")...)
	r := as(t, s, priv, "d-1", orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})
	expect(t, r, http.StatusOK, "")
	var resp orchestrator.PollResponse
	if err := json.Unmarshal(r.body, &resp); err != nil || len(resp.Leases) != 1 {
		t.Fatalf("d-1's poll: %s", r.body)
	}
	l := resp.Leases[0]
	expect(t, as(t, s, priv, "d-1", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventJobCreated)), http.StatusOK, "")

	intrusions := []struct {
		name string
		path string
		body any
		code string
	}{
		{"a poll in d-1's name, listing its task", orchestrator.PathPoll,
			orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Max: 1}, Running: []string{"t-1"}}, orchestrator.CodeForbidden},
		{"a renewal", orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-2", Epoch: l.Epoch}, orchestrator.CodeNotLeaseHolder},
		{"a renewal in d-1's name", orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: l.Epoch}, orchestrator.CodeNotLeaseHolder},
		{"a release", orchestrator.PathRelease(l.LeaseID), orchestrator.ReleaseRequest{DispatcherID: "d-2", Epoch: l.Epoch}, orchestrator.CodeNotLeaseHolder},
		{"a running event", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventRunning), orchestrator.CodeNotLeaseHolder},
		{"a final event", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventFailed), orchestrator.CodeNotLeaseHolder},
		{"a repeat of a stored event", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventJobCreated), orchestrator.CodeNotLeaseHolder},
		{"a log chunk", orchestrator.PathLogs("t-1"), orchestrator.LogChunk{IdempotencyKey: "t-1/log/0", Epoch: l.Epoch, Data: []byte("forged\n")}, orchestrator.CodeNotLeaseHolder},
	}
	for _, tt := range intrusions {
		r := as(t, s, priv2, "d-2", tt.path, tt.body)
		if r.status != http.StatusForbidden || r.errorCode() != tt.code {
			t.Errorf("d-2's %s: %d %s, want 403 %s", tt.name, r.status, r.body, tt.code)
		}
	}
	rec := s.Task("t-1")
	if !rec.Leased || rec.Holder != "d-1" || rec.Final != nil || len(rec.Events) != 1 || len(rec.Log) != 0 || rec.Renewals != 0 || rec.Releases != 0 || rec.Repeats != 0 {
		t.Errorf("t-1 after d-2's tries: %+v, want d-1's lease and job-created event alone", rec)
	}
	if st := s.Stats(); st.NotLeaseHolder != len(intrusions) {
		t.Errorf("%d requests refused as not the lease holder, want %d", st.NotLeaseHolder, len(intrusions))
	}
	// The dispatcher's client takes the answer as the lease not being its
	// own any more (as stale or gone): not retried, and no reason to stop.
	c2, err := orchestrator.NewClient(orchestrator.ClientOptions{URL: s.URL(), DispatcherID: "d-2", Transport: s.Client().Transport,
		Auth: &orchestrator.JWT{Key: priv2, Subject: "d-2", Audience: s.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	err = c2.Report(t.Context(), "t-1", event("t-1", l.Epoch, orchestrator.EventSucceeded))
	if !orchestrator.IsConflict(err) || orchestrator.IsRetryable(err) || orchestrator.IsFatal(err) {
		t.Errorf("d-2's client reporting on d-1's lease: %v; want a conflict, neither retried nor fatal", err)
	}
	if _, err := c2.Renew(t.Context(), l.LeaseID, l.Epoch); !orchestrator.IsGone(err) || orchestrator.IsFatal(err) {
		t.Errorf("d-2's client renewing d-1's lease: %v; want the lease gone for it, not fatal", err)
	}

	// The holder's own path: renew, log, final event, and its repeat.
	expect(t, as(t, s, priv, "d-1", orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: l.Epoch}), http.StatusOK, "")
	expect(t, as(t, s, priv, "d-1", orchestrator.PathLogs("t-1"), orchestrator.LogChunk{IdempotencyKey: "t-1/log/0", Epoch: l.Epoch, Data: []byte("applied\n"), Final: true}), http.StatusOK, "")
	expect(t, as(t, s, priv, "d-1", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventSucceeded)), http.StatusOK, "")
	expect(t, as(t, s, priv, "d-1", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventSucceeded)), http.StatusOK, "")
	expect(t, as(t, s, priv2, "d-2", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventSucceeded)), http.StatusForbidden, orchestrator.CodeNotLeaseHolder)
	rec = s.Task("t-1")
	if rec.Final == nil || rec.Final.Type != orchestrator.EventSucceeded || rec.FinalStored != 1 || rec.Repeats != 1 || string(rec.Log) != "applied\n" || rec.Renewals != 1 {
		t.Errorf("t-1 after d-1's reports: %+v, want its log, one renewal, and its final event stored once and repeated once", rec)
	}
}

// TestReplayedJWTIsRefused: a JWT is good for one request; sent again
// within its lifetime (captured, or reused) it is refused 401, as is one
// without a jti. The dispatcher's Client, which signs one per request, is
// unaffected over many requests.
func TestReplayedJWTIsRefused(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, Options{Dispatchers: []Dispatcher{{ID: "d-1", KeyID: "runner-1", PublicKey: pub}}})
	now := time.Now()
	tok := signJWT(t, priv, jwa.EdDSA(), s.URL(), now, now.Add(time.Minute), "d-1")
	noJTI, err := jwt.NewBuilder().Subject("d-1").Audience([]string{s.URL()}).IssuedAt(now).Expiration(now.Add(time.Minute)).Build()
	if err != nil {
		t.Fatal(err)
	}
	signedNoJTI, err := jwt.Sign(noJTI, jwt.WithKey(jwa.EdDSA(), priv, jws.WithProtectedHeaders(kidHeader(t, "runner-1"))))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		token  string
		status int
	}{
		{"first use", tok, http.StatusNoContent},
		{"replayed", tok, http.StatusUnauthorized},
		{"replayed again", tok, http.StatusUnauthorized},
		{"no jti", string(signedNoJTI), http.StatusUnauthorized},
	} {
		r, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}, tt.token)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != tt.status {
			t.Errorf("%s: %d %s, want %d", tt.name, r.status, r.body, tt.status)
		}
	}
	if st := s.Stats(); st.Replayed != 2 {
		t.Errorf("%d replays counted, want 2", st.Replayed)
	}

	c, err := orchestrator.NewClient(orchestrator.ClientOptions{URL: s.URL(), DispatcherID: "d-1", Transport: s.Client().Transport,
		Auth: &orchestrator.JWT{Key: priv, KeyID: "runner-1", Subject: "d-1", Audience: s.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	s.Add(tasks("t-1")...)
	leases, err := c.Poll(t.Context(), 1, 1, nil, 0)
	if err != nil || len(leases) != 1 {
		t.Fatalf("the client's poll: %v, %d leases", err, len(leases))
	}
	for range 20 {
		if _, err := c.Renew(t.Context(), leases[0].LeaseID, leases[0].Epoch); err != nil {
			t.Fatalf("the client's renewal: %v", err)
		}
	}
	if err := c.Report(t.Context(), "t-1", event("t-1", leases[0].Epoch, orchestrator.EventSucceeded)); err != nil {
		t.Fatalf("the client's final event: %v", err)
	}
	if st := s.Stats(); st.Replayed != 2 || st.Unauthorized != 3 {
		t.Errorf("stats %+v: the client's requests were refused", st)
	}
}

// TestStaticTokenStandsForItsDispatcher: a static token carries no jti and
// no sub; the server's configured DispatcherID is the dispatcher it stands
// for, so a poll in another's name is refused and the leases it takes are
// bound to that dispatcher.
func TestStaticTokenStandsForItsDispatcher(t *testing.T) {
	t.Parallel()
	s := start(t, Options{Token: "s3cret", DispatcherID: "d-1"})
	s.Add(tasks("t-1")...)
	r, err := send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-2", Capacity: orchestrator.Capacity{Free: 1, Max: 1}}, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, r, http.StatusForbidden, orchestrator.CodeForbidden)
	if rec := s.Task("t-1"); rec.Leased {
		t.Fatalf("t-1 leased on a refused poll: %+v", rec)
	}
	if r, err = send(t.Context(), s, orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}}, "s3cret"); err != nil {
		t.Fatal(err)
	}
	expect(t, r, http.StatusOK, "")
	// The same token, sent again and again: static tokens have no jti.
	if r, err = send(t.Context(), s, orchestrator.PathEvents("t-1"), event("t-1", 1, orchestrator.EventSucceeded), "s3cret"); err != nil {
		t.Fatal(err)
	}
	expect(t, r, http.StatusOK, "")
	if rec := s.Task("t-1"); rec.Final == nil || rec.Holder != "d-1" {
		t.Errorf("t-1 %+v, want d-1's final event stored", rec)
	}
}

// kidHeader is a JWS protected header naming kid.
func kidHeader(t *testing.T, kid string) jws.Headers {
	t.Helper()
	h := jws.NewHeaders()
	if err := h.Set(jws.KeyIDKey, kid); err != nil {
		t.Fatal(err)
	}
	return h
}

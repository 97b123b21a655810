package orchestratortest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwt"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
)

// keyPair makes an Ed25519 key pair.
func keyPair(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

// signed is a JWT as the dispatcher signs them, with the given kid and sub.
func signed(t *testing.T, s *Server, key ed25519.PrivateKey, kid, sub string) string {
	t.Helper()
	tok, err := (&orchestrator.JWT{Key: key, KeyID: kid, Subject: sub, Audience: s.URL()}).Token(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// sendAs posts body to path with bearer, failing on a transport error.
func sendAs(t *testing.T, s *Server, bearer, path string, body any) reply {
	t.Helper()
	r, err := send(t.Context(), s, path, body, bearer)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

// pollAs polls as the holder of bearer and returns the leases.
func pollAs(t *testing.T, s *Server, bearer string, req orchestrator.PollRequest) []orchestrator.Lease {
	t.Helper()
	r := sendAs(t, s, bearer, orchestrator.PathPoll, req)
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

// TestJWTActsOnlyForItsKeysDispatcher: each dispatcher has a key of its own,
// named by the JWT header's kid, and a JWT acts only for the dispatcher its
// key is registered for. d-2 signing sub d-1 with its own key (under its own
// kid, or claiming d-1's), a kid no key is registered under, and a token
// without kid are all refused 401 with the reason, and change nothing of
// d-1's task: not its final event, not its lease, not a poll in its name.
func TestJWTActsOnlyForItsKeysDispatcher(t *testing.T) {
	t.Parallel()
	pub1, priv1 := keyPair(t)
	pub2, priv2 := keyPair(t)
	_, stranger := keyPair(t)
	s := start(t, Options{LeaseSeconds: 60, Dispatchers: []Dispatcher{
		{ID: "d-1", KeyID: "k-1", PublicKey: pub1},
		{ID: "d-2", KeyID: "k-2", PublicKey: pub2},
	}})
	s.Add(tasks("t-1")...)
	leases := pollAs(t, s, signed(t, s, priv1, "k-1", "d-1"), orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})
	if len(leases) != 1 {
		t.Fatalf("d-1 got %d leases", len(leases))
	}
	l := leases[0]

	tests := []struct {
		name  string
		token func() string
		// why is part of the 401's message.
		why string
	}{
		{"d-2's key signs sub d-1 under its own kid", func() string { return signed(t, s, priv2, "k-2", "d-1") }, `the key of kid "k-2" is dispatcher "d-2"'s`},
		{"d-2's key signs sub d-1 under d-1's kid", func() string { return signed(t, s, priv2, "k-1", "d-1") }, `kid "k-1"`},
		{"d-2's key signs sub d-1 under the kid d-1", func() string { return signed(t, s, priv2, "d-1", "d-1") }, `unknown kid "d-1"`},
		{"an unknown kid", func() string { return signed(t, s, stranger, "k-9", "d-1") }, `unknown kid "k-9"`},
		{"no kid", func() string { return signedWithoutKid(t, s, priv1, "d-1") }, "no kid"},
	}
	requests := []struct {
		name string
		path string
		body any
	}{
		{"the final event of d-1's task", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventFailed)},
		{"a renewal of d-1's lease", orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: l.Epoch}},
		{"a log chunk", orchestrator.PathLogs("t-1"), orchestrator.LogChunk{IdempotencyKey: "t-1/log/0", Epoch: l.Epoch, Data: []byte("forged\n")}},
		{"a poll in d-1's name", orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Max: 1}, Running: []string{"t-1"}}},
	}
	refused := 0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, req := range requests {
				r := sendAs(t, s, tt.token(), req.path, req.body)
				refused++
				var e orchestrator.ErrorBody
				_ = json.Unmarshal(r.body, &e)
				if r.status != http.StatusUnauthorized || e.Code != orchestrator.CodeUnauthorized || !strings.Contains(e.Message, tt.why) {
					t.Errorf("%s: %d %s, want 401 saying %s", req.name, r.status, r.body, tt.why)
				}
			}
		})
	}
	rec := s.Task("t-1")
	if rec.Final != nil || len(rec.Events) != 0 || len(rec.Log) != 0 || rec.Renewals != 0 || !rec.Leased || rec.Holder != "d-1" || len(rec.Leases) != 1 {
		t.Errorf("t-1 after the impersonations: %+v, want d-1's lease alone, untouched", rec)
	}
	if st := s.Stats(); st.Unauthorized != refused {
		t.Errorf("%d requests refused 401, want %d", st.Unauthorized, refused)
	}
	// d-1's own key, under its own kid, is taken.
	expect(t, sendAs(t, s, signed(t, s, priv1, "k-1", "d-1"), orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventSucceeded)), http.StatusOK, "")
	if rec := s.Task("t-1"); rec.Final == nil || rec.Final.Type != orchestrator.EventSucceeded {
		t.Errorf("t-1 %+v, want d-1's final event", rec)
	}
}

// signedWithoutKid is a JWT of sub, valid for a minute, with no kid: a
// token the dispatcher's client does not make (it always sends one).
func signedWithoutKid(t *testing.T, s *Server, key ed25519.PrivateKey, sub string) string {
	t.Helper()
	now := time.Now()
	tok, err := jwt.NewBuilder().Subject(sub).Audience([]string{s.URL()}).IssuedAt(now).Expiration(now.Add(time.Minute)).JwtID(rand.Text()).Build()
	if err != nil {
		t.Fatal(err)
	}
	b, err := jwt.Sign(tok, jwt.WithKey(jwa.EdDSA(), key))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSingleKeyStandsForOneDispatcher: Options.PublicKey without
// DispatcherID is bound by the first token it verifies to that token's sub
// and kid; the same key then signs for no other dispatcher, under no other
// kid.
func TestSingleKeyStandsForOneDispatcher(t *testing.T) {
	t.Parallel()
	pub, priv := keyPair(t)
	s := start(t, Options{PublicKey: pub})
	poll := func(kid, sub string) reply {
		return sendAs(t, s, signed(t, s, priv, kid, sub), orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: sub})
	}
	expect(t, poll("d-1", "d-1"), http.StatusNoContent, "")
	expect(t, poll("d-1", "d-1"), http.StatusNoContent, "")
	expect(t, poll("d-1", "d-2"), http.StatusUnauthorized, orchestrator.CodeUnauthorized)
	expect(t, poll("d-2", "d-2"), http.StatusUnauthorized, orchestrator.CodeUnauthorized)

	// With DispatcherID, the key is that dispatcher's from the start.
	bound := start(t, Options{PublicKey: pub, DispatcherID: "d-1"})
	expect(t, sendAs(t, bound, signed(t, bound, priv, "d-2", "d-2"), orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-2"}), http.StatusUnauthorized, orchestrator.CodeUnauthorized)
	expect(t, sendAs(t, bound, signed(t, bound, priv, "d-1", "d-2"), orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-2"}), http.StatusUnauthorized, orchestrator.CodeUnauthorized)
	expect(t, sendAs(t, bound, signed(t, bound, priv, "d-1", "d-1"), orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1"}), http.StatusNoContent, "")
}

// TestStaticTokenActsOnlyForItsDispatcher: each static token stands for one
// dispatcher. d-2's token naming d-1's task or lease (an event, a final
// event, a log chunk, a renewal or release in either name, a poll in d-1's
// name) is refused, and d-1's task is unchanged. A token configured for no
// dispatcher is refused by New.
func TestStaticTokenActsOnlyForItsDispatcher(t *testing.T) {
	t.Parallel()
	s := start(t, Options{Dispatchers: []Dispatcher{{ID: "d-1", Token: "tok-1"}, {ID: "d-2", Token: "tok-2"}}})
	s.Add(tasks("t-1")...)
	leases := pollAs(t, s, "tok-1", orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})
	if len(leases) != 1 {
		t.Fatalf("d-1 got %d leases", len(leases))
	}
	l := leases[0]
	expect(t, sendAs(t, s, "tok-1", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventJobCreated)), http.StatusOK, "")

	tests := []struct {
		name   string
		bearer string
		path   string
		body   any
		status int
		code   string
	}{
		{"d-2: the final event of d-1's task", "tok-2", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventSucceeded), http.StatusForbidden, orchestrator.CodeNotLeaseHolder},
		{"d-2: a repeat of d-1's event", "tok-2", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventJobCreated), http.StatusForbidden, orchestrator.CodeNotLeaseHolder},
		{"d-2: a log chunk of d-1's task", "tok-2", orchestrator.PathLogs("t-1"), orchestrator.LogChunk{IdempotencyKey: "t-1/log/0", Epoch: l.Epoch, Data: []byte("forged\n")}, http.StatusForbidden, orchestrator.CodeNotLeaseHolder},
		{"d-2: a log chunk with a later epoch", "tok-2", orchestrator.PathLogs("t-1"), orchestrator.LogChunk{IdempotencyKey: "t-1/log/0", Epoch: l.Epoch + 1, Data: []byte("forged\n")}, http.StatusBadRequest, orchestrator.CodeBadRequest},
		{"d-2: a renewal of d-1's lease in d-1's name", "tok-2", orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-1", Epoch: l.Epoch}, http.StatusForbidden, orchestrator.CodeNotLeaseHolder},
		{"d-2: a release of d-1's lease", "tok-2", orchestrator.PathRelease(l.LeaseID), orchestrator.ReleaseRequest{DispatcherID: "d-2", Epoch: l.Epoch}, http.StatusForbidden, orchestrator.CodeNotLeaseHolder},
		{"d-2: a poll in d-1's name listing its task", "tok-2", orchestrator.PathPoll, orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Max: 1}, Running: []string{"t-1"}}, http.StatusForbidden, orchestrator.CodeForbidden},
		{"d-1: a renewal in d-2's name", "tok-1", orchestrator.PathRenew(l.LeaseID), orchestrator.RenewRequest{DispatcherID: "d-2", Epoch: l.Epoch}, http.StatusForbidden, orchestrator.CodeNotLeaseHolder},
		{"a token of no dispatcher", "tok-3", orchestrator.PathEvents("t-1"), event("t-1", l.Epoch, orchestrator.EventSucceeded), http.StatusUnauthorized, orchestrator.CodeUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			expect(t, sendAs(t, s, tt.bearer, tt.path, tt.body), tt.status, tt.code)
		})
	}
	rec := s.Task("t-1")
	if rec.Final != nil || len(rec.Events) != 1 || len(rec.Log) != 0 || rec.Renewals != 0 || rec.Releases != 0 || rec.Repeats != 0 || !rec.Leased || rec.Holder != "d-1" {
		t.Errorf("t-1 after d-2's tries: %+v, want d-1's lease and job-created event alone", rec)
	}

	for name, opts := range map[string]Options{
		"Token without DispatcherID":               {Token: "tok"},
		"ServiceAccountToken without DispatcherID": {ServiceAccountToken: "sa"},
		"one token for two dispatchers":            {Dispatchers: []Dispatcher{{ID: "d-1", Token: "tok"}, {ID: "d-2", Token: "tok"}}},
		"one kid for two keys":                     {Dispatchers: []Dispatcher{{ID: "d-1", KeyID: "k", PublicKey: make(ed25519.PublicKey, ed25519.PublicKeySize)}, {ID: "d-2", KeyID: "k", PublicKey: make(ed25519.PublicKey, ed25519.PublicKeySize)}}},
		"a dispatcher without credentials":         {Dispatchers: []Dispatcher{{ID: "d-1"}}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New took %s", name)
				}
			}()
			New(opts)
		}()
	}
}

// TestReissueOnlyToThePreviousHolderWithinCapacity: a poll listing a task
// in running is re-issued its lapsed lease only if the poll's dispatcher
// held the task's last lease, and re-issued and new leases together stay
// within capacity.max (new ones within capacity.free). Another dispatcher
// listing the task gets nothing for it, and the task stays queued at its
// epoch, its secretEnv with no one.
func TestReissueOnlyToThePreviousHolderWithinCapacity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		bearer     string
		dispatcher string
		running    []string
		capacity   orchestrator.Capacity
		// reissued and fresh are the tasks re-issued and newly leased.
		reissued, fresh []string
	}{
		{name: "d-2 lists d-1's lapsed task, no free capacity", bearer: "tok-2", dispatcher: "d-2",
			running: []string{"t-1"}, capacity: orchestrator.Capacity{Max: 1}},
		{name: "d-2 lists d-1's lapsed tasks and its own", bearer: "tok-2", dispatcher: "d-2",
			running: []string{"t-1", "t-2", "t-3"}, capacity: orchestrator.Capacity{Max: 3}, reissued: []string{"t-3"}},
		{name: "d-1 gets its lapsed tasks back", bearer: "tok-1", dispatcher: "d-1",
			running: []string{"t-1", "t-2"}, capacity: orchestrator.Capacity{Max: 2}, reissued: []string{"t-1", "t-2"}},
		{name: "d-1's re-issues stop at capacity.max", bearer: "tok-1", dispatcher: "d-1",
			running: []string{"t-1", "t-2"}, capacity: orchestrator.Capacity{Max: 1}, reissued: []string{"t-1"}},
		{name: "re-issues leave no room for a new lease", bearer: "tok-1", dispatcher: "d-1",
			running: []string{"t-1", "t-2"}, capacity: orchestrator.Capacity{Free: 1, Max: 2}, reissued: []string{"t-1", "t-2"}},
		{name: "room beyond the re-issues takes a new lease", bearer: "tok-1", dispatcher: "d-1",
			running: []string{"t-1"}, capacity: orchestrator.Capacity{Free: 1, Max: 2}, reissued: []string{"t-1"}, fresh: []string{"t-2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := fakeClock()
			s := start(t, Options{LeaseSeconds: 1, Clock: clk, Dispatchers: []Dispatcher{{ID: "d-1", Token: "tok-1"}, {ID: "d-2", Token: "tok-2"}}})
			s.Add(tasks("t-1", "t-2", "t-3")...)
			s.mu.Lock()
			s.tasks["t-1"].rec.Task.SecretEnv = map[string]string{"TF_VAR_token": "s3cret"}
			s.mu.Unlock()
			if got := leaseTasks(pollAs(t, s, "tok-1", orchestrator.PollRequest{DispatcherID: "d-1", Capacity: orchestrator.Capacity{Free: 2, Max: 2}})); !slices.Equal(got, []string{"t-1", "t-2"}) {
				t.Fatalf("d-1 leased %v", got)
			}
			if got := leaseTasks(pollAs(t, s, "tok-2", orchestrator.PollRequest{DispatcherID: "d-2", Capacity: orchestrator.Capacity{Free: 1, Max: 1}})); !slices.Equal(got, []string{"t-3"}) {
				t.Fatalf("d-2 leased %v", got)
			}
			clk.Step(time.Second) // every lease lapses

			got := pollAs(t, s, tt.bearer, orchestrator.PollRequest{DispatcherID: tt.dispatcher, Capacity: tt.capacity, Running: tt.running})
			var reissued, fresh []string
			for _, l := range got {
				if l.Task.ID == "t-1" && l.Task.SecretEnv["TF_VAR_token"] != "s3cret" {
					t.Errorf("t-1's lease without its secretEnv")
				}
				if l.Epoch == 2 && slices.Contains(tt.running, l.Task.ID) {
					reissued = append(reissued, l.Task.ID)
				} else {
					fresh = append(fresh, l.Task.ID)
				}
			}
			if !slices.Equal(reissued, tt.reissued) || !slices.Equal(fresh, tt.fresh) {
				t.Errorf("%s re-issued %v and newly leased %v, want %v and %v", tt.dispatcher, reissued, fresh, tt.reissued, tt.fresh)
			}
			// Every task not handed out stays as it was: queued, at epoch 1,
			// with its one lease.
			for _, id := range []string{"t-1", "t-2", "t-3"} {
				if slices.Contains(reissued, id) || slices.Contains(fresh, id) {
					continue
				}
				if rec := s.Task(id); !rec.Queued || rec.Leased || rec.Epoch != 1 || len(rec.Leases) != 1 {
					t.Errorf("%s, not handed out: %+v, want it queued at epoch 1", id, rec)
				}
			}
			if st := s.Stats(); st.CapacityViolations != 0 {
				t.Errorf("%d capacity violations", st.CapacityViolations)
			}
		})
	}
}

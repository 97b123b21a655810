package orchestratortest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
)

// Endpoint names a protocol endpoint, for Stats and Faults.Endpoints.
type Endpoint string

// The endpoints. EndpointOther is any path the protocol does not have.
const (
	EndpointPoll  Endpoint = "poll"
	EndpointRenew Endpoint = "renew"
	// EndpointRelease is where a lease is handed back unused.
	EndpointRelease Endpoint = "release"
	EndpointEvents  Endpoint = "events"
	EndpointLogs    Endpoint = "logs"
	EndpointToken   Endpoint = "token"
	EndpointOther   Endpoint = "other"
)

// Faults are the faults a Server injects. They apply to every endpoint,
// token exchange included, unless Endpoints narrows them; a request meets
// at most one of Unreachable, the 503 errors and DropResponseRate, checked
// in that order. Unreachability and 503s come before the version and
// authentication checks, as a load balancer's would; a dropped response
// may be any answer, an error included. The rates are probabilities in
// [0, 1], drawn from the source Options.Seed seeds.
type Faults struct {
	// Unreachable closes the connection of every request without an
	// answer, before looking at it: the client sees a connection error.
	Unreachable bool
	// UnreachableUntil does the same as Unreachable until the given time.
	UnreachableUntil time.Time

	// ErrorBurst answers the next ErrorBurst requests 503, without
	// processing them; it counts down as it does (Server.Faults shows the
	// rest).
	ErrorBurst int
	// ErrorRate answers this fraction of requests 503, without processing
	// them.
	ErrorRate float64
	// RetryAfter, when positive, is sent with each injected 503 as a
	// Retry-After header in whole seconds, at least 1.
	RetryAfter time.Duration

	// DropResponseRate processes this fraction of requests in full, state
	// changes included, and then closes the connection instead of sending
	// the response.
	DropResponseRate float64

	// DuplicateLeaseRate delivers this fraction of the leases a poll hands
	// out twice, with the same lease ID and epoch: again in the same poll
	// response, or, with DuplicateNextPoll, in the next poll response to
	// the same dispatcher ID (if the lease is still the task's live one by
	// then).
	DuplicateLeaseRate float64
	// DuplicateNextPoll delays duplicates to the dispatcher's next poll.
	DuplicateNextPoll bool
	// OverDeliver hands out up to this many new leases beyond the
	// capacity a poll asks for (a misbehaving orchestrator); they count in
	// Stats.CapacityViolations.
	OverDeliver int

	// Endpoints, when not empty, limits the faults above to requests to
	// these endpoints.
	Endpoints []Endpoint

	// Hold holds event requests of these types unprocessed and unanswered
	// until Server.Release (or Close, or the client giving up), then closes
	// their connections without an answer: the dispatcher is stuck between
	// doing something and having it acknowledged. Hold comes after
	// Unreachable and the 503s, and Endpoints does not limit it.
	Hold []orchestrator.EventType
}

func (f *Faults) appliesTo(e Endpoint) bool {
	return len(f.Endpoints) == 0 || slices.Contains(f.Endpoints, e)
}

// Stats counts what a Server saw and did.
type Stats struct {
	// Requests counts requests by endpoint, faulted ones included.
	Requests map[Endpoint]int
	// Statuses counts the responses sent by status code; dropped responses
	// and closed connections are not among them.
	Statuses map[int]int
	// Unreachable counts requests whose connection was closed unanswered
	// by Faults.Unreachable or Faults.UnreachableUntil.
	Unreachable int
	// InjectedErrors counts the 503s of Faults.ErrorBurst and
	// Faults.ErrorRate.
	InjectedErrors int
	// DroppedResponses counts the responses Faults.DropResponseRate
	// dropped.
	DroppedResponses int
	// DuplicateLeases counts the duplicate lease deliveries.
	DuplicateLeases int
	// LeasesIssued counts the leases handed out, re-issued ones included
	// and duplicates not.
	LeasesIssued int
	// Reissued counts the leases re-issued to a dispatcher that listed the
	// task in PollRequest.Running.
	Reissued int
	// ReissueRefused counts the tasks a poll listed in Running and was not
	// re-issued although their lease had lapsed: another dispatcher held
	// their last lease, or the poll's Capacity.Max was reached.
	ReissueRefused int
	// Requeues counts the leases that expired, putting their task back in
	// the queue.
	Requeues int
	// CapacityViolations counts poll responses with more new leases than
	// the poll's Capacity.Free; it stays 0 unless the server is broken.
	CapacityViolations int
	// Unauthorized counts 401 answers.
	Unauthorized int
	// Replayed counts the JWTs refused (401) because their jti was used
	// before.
	Replayed int
	// NotLeaseHolder counts the 403 answers to requests that name a lease
	// another dispatcher holds, and to polls for another dispatcher.
	NotLeaseHolder int
	// UnsupportedVersion counts 426 answers.
	UnsupportedVersion int
	// Held counts the event requests Faults.Hold held.
	Held int
	// PollsWaiting is how many polls are held now, waiting for a task: a
	// dispatcher that has stopped may leave one until the server notices
	// its connection closed.
	PollsWaiting int
}

func (st *Stats) clone() Stats {
	c := *st
	c.Requests = make(map[Endpoint]int, len(st.Requests))
	for k, v := range st.Requests {
		c.Requests[k] = v
	}
	c.Statuses = make(map[int]int, len(st.Statuses))
	for k, v := range st.Statuses {
		c.Statuses[k] = v
	}
	return c
}

// SetFaults replaces the faults in effect.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.Endpoints = slices.Clone(f.Endpoints)
	f.Hold = slices.Clone(f.Hold)
	s.faults = f
}

// Release ends the requests Faults.Hold holds now, closing their
// connections without an answer. Requests arriving later are held while
// Faults.Hold still names their type.
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.release)
	s.release = make(chan struct{})
}

// Faults returns the faults in effect, ErrorBurst counted down by the 503s
// it caused so far.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults
	f.Endpoints = slices.Clone(f.Endpoints)
	f.Hold = slices.Clone(f.Hold)
	return f
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.clone()
}

// WaitHeld waits until cond holds of the counters, or ctx ends (it returns
// ctx's error then). cond is checked at once and again each time a request
// starts or stops being held: a poll waiting for a task (PollsWaiting) or
// an event Faults.Hold holds (Held). A test waits on that, not on time.
func (s *Server) WaitHeld(ctx context.Context, cond func(Stats) bool) error {
	for {
		s.mu.Lock()
		ok, holding := cond(s.stats.clone()), s.holding
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-holding:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// holdingLocked tells WaitHeld that a request started or stopped being
// held. s.mu must be held.
func (s *Server) holdingLocked() {
	close(s.holding)
	s.holding = make(chan struct{})
}

// chance draws against rate; it draws nothing for a rate of 0. s.mu must
// be held.
func (s *Server) chance(rate float64) bool {
	if rate <= 0 {
		return false
	}
	return s.rng.Float64() < rate
}

// fault is what happens to a request before it is processed.
type fault int

const (
	faultNone fault = iota
	faultUnreachable
	faultError
)

// preFault counts the request and decides its fate before processing.
func (s *Server) preFault(e Endpoint) (fault, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests[e]++
	f := &s.faults
	if !f.appliesTo(e) {
		return faultNone, 0
	}
	if f.Unreachable || s.clock.Now().Before(f.UnreachableUntil) {
		s.stats.Unreachable++
		return faultUnreachable, 0
	}
	if f.ErrorBurst > 0 {
		f.ErrorBurst--
		s.stats.InjectedErrors++
		return faultError, f.RetryAfter
	}
	if s.chance(f.ErrorRate) {
		s.stats.InjectedErrors++
		return faultError, f.RetryAfter
	}
	return faultNone, 0
}

// dropResponse decides whether a processed request's response is dropped.
func (s *Server) dropResponse(e Endpoint) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.faults.appliesTo(e) || !s.chance(s.faults.DropResponseRate) {
		return false
	}
	s.stats.DroppedResponses++
	return true
}

// hold holds an event request while Faults.Hold names its type and tells
// whether it did. It reads the body and puts it back for the handler.
func (s *Server) hold(r *http.Request) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	var ev struct {
		Type orchestrator.EventType `json:"type"`
	}
	if json.Unmarshal(body, &ev) != nil {
		return false
	}
	s.mu.Lock()
	if !slices.Contains(s.faults.Hold, ev.Type) {
		s.mu.Unlock()
		return false
	}
	s.stats.Held++
	s.holdingLocked()
	release := s.release
	s.mu.Unlock()
	s.logf("%s %s: %s event held", r.Method, r.URL.Path, ev.Type)
	select {
	case <-release:
	case <-s.closed:
	case <-r.Context().Done():
	}
	s.logf("%s %s: held %s event released, connection closed", r.Method, r.URL.Path, ev.Type)
	return true
}

func (s *Server) countStatus(code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Statuses[code]++
}

// serve is the server's handler: faults, version, authentication, then
// the endpoint.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	e, h := s.route(r.URL.Path)
	switch f, retryAfter := s.preFault(e); f {
	case faultUnreachable:
		s.logf("%s %s: unreachable, connection closed", r.Method, r.URL.Path)
		hangUp(w)
		return
	case faultError:
		s.logf("%s %s: injected 503", r.Method, r.URL.Path)
		if retryAfter > 0 {
			secs := int((retryAfter + time.Second - 1) / time.Second)
			w.Header().Set("Retry-After", strconv.Itoa(secs))
		}
		s.countStatus(http.StatusServiceUnavailable)
		writeJSON(w, http.StatusServiceUnavailable, orchestrator.ErrorBody{Code: "unavailable", Message: "injected fault"})
		return
	case faultNone:
	}
	if e == EndpointEvents && s.hold(r) {
		hangUp(w)
		return
	}

	buf := &bufferedResponse{header: http.Header{}}
	s.handle(buf, r, e, h)
	if s.dropResponse(e) {
		s.logf("%s %s: processed (%d), response dropped", r.Method, r.URL.Path, buf.status())
		hangUp(w)
		return
	}
	s.logf("%s %s: %d", r.Method, r.URL.Path, buf.status())
	s.countStatus(buf.status())
	buf.copyTo(w)
}

// handle checks the version and the credentials, then runs h.
func (s *Server) handle(w http.ResponseWriter, r *http.Request, e Endpoint, h handler) {
	if r.Header.Get(orchestrator.HeaderProtocol) != orchestrator.Version {
		s.mu.Lock()
		s.stats.UnsupportedVersion++
		s.mu.Unlock()
		w.Header().Set(orchestrator.HeaderProtocol, orchestrator.Version)
		writeJSON(w, http.StatusUpgradeRequired, supported)
		return
	}
	if h == nil {
		writeError(w, http.StatusNotFound, codeNotFound, "no endpoint "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, orchestrator.CodeBadRequest, r.Method+" is not allowed, only POST")
		return
	}
	var caller string
	if e != EndpointToken {
		var err error
		if caller, err = s.authenticate(r); err != nil {
			s.mu.Lock()
			s.stats.Unauthorized++
			s.mu.Unlock()
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeError(w, http.StatusUnauthorized, orchestrator.CodeUnauthorized, err.Error())
			return
		}
	}
	h(w, r, caller)
}

// handler serves one endpoint, the request's version and credentials
// checked; caller is the dispatcher the credentials stand for, empty for
// no one dispatcher.
type handler func(w http.ResponseWriter, r *http.Request, caller string)

// route maps a path to its endpoint and handler; the handler is nil for a
// path the protocol does not have.
func (s *Server) route(path string) (Endpoint, handler) {
	switch path {
	case orchestrator.PathPoll:
		return EndpointPoll, s.poll
	case orchestrator.PathToken:
		return EndpointToken, s.token
	}
	if id, ok := strings.CutPrefix(path, "/v1/leases/"); ok {
		if id, ok := strings.CutSuffix(id, ":renew"); ok && id != "" && !strings.Contains(id, "/") {
			return EndpointRenew, func(w http.ResponseWriter, r *http.Request, caller string) { s.renew(w, r, caller, id) }
		}
		if id, ok := strings.CutSuffix(id, ":release"); ok && id != "" && !strings.Contains(id, "/") {
			return EndpointRelease, func(w http.ResponseWriter, r *http.Request, caller string) { s.releaseLease(w, r, caller, id) }
		}
		return EndpointOther, nil
	}
	if rest, ok := strings.CutPrefix(path, "/v1/tasks/"); ok {
		if id, ok := strings.CutSuffix(rest, "/events"); ok && id != "" && !strings.Contains(id, "/") {
			return EndpointEvents, func(w http.ResponseWriter, r *http.Request, caller string) { s.events(w, r, caller, id) }
		}
		if id, ok := strings.CutSuffix(rest, "/logs"); ok && id != "" && !strings.Contains(id, "/") {
			return EndpointLogs, func(w http.ResponseWriter, r *http.Request, caller string) { s.logs(w, r, caller, id) }
		}
	}
	return EndpointOther, nil
}

// hangUp closes a request's connection without an answer, resetting it
// where it can, the way a vanished server or a broken network looks to the
// client.
func hangUp(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): abort the response instead.
		panic(http.ErrAbortHandler)
	}
	raw := conn
	if tc, ok := conn.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	if tcp, ok := raw.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = raw.Close()
}

// bufferedResponse holds a response until it is known whether it is
// dropped.
type bufferedResponse struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	return b.body.Write(p)
}

func (b *bufferedResponse) status() int {
	if b.code == 0 {
		return http.StatusOK
	}
	return b.code
}

func (b *bufferedResponse) copyTo(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	w.WriteHeader(b.status())
	_, _ = w.Write(b.body.Bytes())
}

// Package orchestratortest is an in-memory orchestrator for tests: an HTTPS
// server on 127.0.0.1 that speaks the protocol of package orchestrator,
// records everything a dispatcher reports, and injects faults (an
// unreachable server, 503 answers, dropped responses, leases delivered
// twice, event requests held unanswered) on demand.
//
// A test adds tasks with Add, starts the server, points a dispatcher at URL
// (trusting the certificate CAFile writes, or using Client in-process), and
// asserts on Task, Tasks, Polls and Stats, waiting for held requests with
// WaitHeld. Every method is safe for concurrent use.
package orchestratortest

import (
	"cmp"
	"crypto/ed25519"
	"encoding/pem"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
)

// Options configures a Server. Requests need no authentication unless
// Dispatchers, PublicKey, Token or ServiceAccountToken is set; then every
// request (but the token exchange) acts for exactly one dispatcher, the one
// its credentials were registered for, and may name only the leases that
// dispatcher holds.
type Options struct {
	// LeaseSeconds is the lifetime of a lease and of each renewal; default 60.
	LeaseSeconds int
	// MaxWait caps how long a poll is held: a poll waits
	// min(waitSeconds, MaxWait) for a task; default 30s.
	MaxWait time.Duration

	// Dispatchers are the dispatchers the server knows, each with
	// credentials of its own (an Ed25519 key named by its kid, a static
	// token, or both): a JWT is verified with the key its header's kid
	// names and acts for that key's dispatcher alone, so a dispatcher cannot
	// sign for another. IDs, key IDs and tokens must be unique; New panics
	// otherwise.
	Dispatchers []Dispatcher

	// PublicKey, when set, is one dispatcher's Ed25519 key: the dispatcher
	// DispatcherID names (kid DispatcherID), or, with DispatcherID empty, the
	// dispatcher whose sub and kid the first token it verifies carries: the
	// key is bound to that dispatcher and kid for the server's life, and a
	// token naming another is refused. For several dispatchers, use
	// Dispatchers. The JWT rules are Dispatcher.PublicKey's.
	PublicKey ed25519.PublicKey
	// Token, when set, is a static bearer token for the dispatcher
	// DispatcherID, which must be set.
	Token string
	// DispatcherID is the dispatcher PublicKey, Token, and the access
	// tokens the exchange issues stand for: their requests act for it alone.
	DispatcherID string
	// ServiceAccountToken, when set, enables token exchange: a TokenRequest
	// carrying it at orchestrator.PathToken is answered with a new random
	// access token, a valid bearer token of DispatcherID (which must be
	// set) for ExchangeTTL.
	ServiceAccountToken string
	// ExchangeTTL is the lifetime of an exchanged token; default 1h. The
	// response's expires_in is ExchangeTTL rounded up to whole seconds, at
	// least 1.
	ExchangeTTL time.Duration

	// Seed seeds the random source that decides which requests the fault
	// rates hit, so that a sequence of requests meets the same faults.
	Seed uint64
	// Faults are the faults in effect from the start; see SetFaults.
	Faults Faults
	// Logf, when set, is told about every request and every injected
	// fault (t.Logf fits).
	Logf func(format string, args ...any)
	// Clock tells the time of leases, expiries, tokens and faults, and
	// paces held polls. Default: the real clock. A test that steps a fake
	// one sees leases expire without waiting.
	Clock clock.WithTicker
}

// Dispatcher is a dispatcher the server knows, with its credentials.
type Dispatcher struct {
	// ID is the dispatcher's ID: the sub its JWTs must carry and the
	// dispatcherId of its polls. Required.
	ID string
	// KeyID is the kid of its JWTs, naming PublicKey; default ID (what the
	// dispatcher sends unless --orchestrator-key-id says otherwise).
	KeyID string
	// PublicKey, when set, is its Ed25519 public key. A JWT whose kid is
	// KeyID must be signed with it (header alg EdDSA) and carry: exp in the
	// future and at most 5 minutes after iat, iat present and not in the
	// future, nbf (if present) not in the future, all checked with no
	// leeway, aud the server's URL (as URL returns it), sub ID, and a jti
	// not seen before within its token's lifetime (one token per request).
	PublicKey ed25519.PublicKey
	// Token, when set, is a static bearer token that stands for this
	// dispatcher alone.
	Token string
}

// Server is the fake orchestrator. Make one with New.
type Server struct {
	opts  Options
	clock clock.WithTicker
	ts    *httptest.Server

	closeOnce sync.Once
	closed    chan struct{}

	mu     sync.Mutex
	rng    *rand.Rand
	faults Faults
	stats  Stats

	// keys are the dispatchers' keys by kid, tokens their static tokens;
	// both written by New, but for the binding of an unbound key
	// (Options.PublicKey without DispatcherID), written by verifyJWT under mu.
	keys   map[string]*dispatcherKey
	tokens map[string]string // static token -> dispatcher ID
	// open says no credentials are configured: requests act for no one
	// dispatcher. hasKeys says some key is. Both written by New.
	open, hasKeys bool

	tasks   map[string]*task
	order   []*task              // in Add order
	queue   []*task              // tasks waiting for a lease, FIFO
	byLease map[string]*task     // every lease ID ever issued
	dups    map[string][]dup     // duplicates owed to a dispatcher's next poll
	issued  map[string]time.Time // exchanged tokens and their expiry; each stands for opts.DispatcherID
	jtis    map[string]time.Time // JWT IDs seen, until their token expires
	pruned  time.Time            // when expired jtis were last dropped
	polls   []PollRecord
	// wake is closed, and replaced, whenever a task becomes available.
	wake chan struct{}
	// release is closed, and replaced, by Release.
	release chan struct{}
	// holding is closed, and replaced, whenever a request starts or stops
	// being held (WaitHeld).
	holding chan struct{}
}

// New returns a Server, not started yet, configured by opts. It panics on
// a configuration that would let a credential stand for no dispatcher, or
// for more than one: a Dispatcher without ID or credentials, a duplicate ID,
// kid or token, a Token or ServiceAccountToken without DispatcherID, or a
// key that is not Ed25519.
func New(opts Options) *Server {
	keys := map[string]*dispatcherKey{}
	tokens := map[string]string{}
	ids := map[string]bool{}
	for _, d := range opts.Dispatchers {
		switch {
		case d.ID == "":
			panic("orchestratortest: a Dispatcher without ID")
		case ids[d.ID]:
			panic("orchestratortest: Dispatcher " + d.ID + " given twice")
		case len(d.PublicKey) == 0 && d.Token == "":
			panic("orchestratortest: Dispatcher " + d.ID + " has neither PublicKey nor Token")
		}
		ids[d.ID] = true
		if len(d.PublicKey) > 0 {
			addKey(keys, d.ID, cmp.Or(d.KeyID, d.ID), d.PublicKey)
		}
		if d.Token != "" {
			addToken(tokens, d.ID, d.Token)
		}
	}
	if (opts.Token != "" || opts.ServiceAccountToken != "") && opts.DispatcherID == "" {
		panic("orchestratortest: Token and ServiceAccountToken stand for DispatcherID, which is empty")
	}
	if len(opts.PublicKey) > 0 {
		if opts.DispatcherID == "" {
			// Bound to the first dispatcher that signs with it (verifyJWT).
			keys[""] = &dispatcherKey{key: opts.PublicKey}
			checkKey(opts.PublicKey)
		} else {
			addKey(keys, opts.DispatcherID, opts.DispatcherID, opts.PublicKey)
		}
	}
	if opts.Token != "" {
		addToken(tokens, opts.DispatcherID, opts.Token)
	}
	if opts.LeaseSeconds <= 0 {
		opts.LeaseSeconds = 60
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = 30 * time.Second
	}
	if opts.ExchangeTTL <= 0 {
		opts.ExchangeTTL = time.Hour
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	opts.Faults.Endpoints = slices.Clone(opts.Faults.Endpoints)
	opts.Faults.Hold = slices.Clone(opts.Faults.Hold)
	s := &Server{
		opts:    opts,
		clock:   opts.Clock,
		keys:    keys,
		tokens:  tokens,
		open:    len(keys) == 0 && len(tokens) == 0 && opts.ServiceAccountToken == "",
		hasKeys: len(keys) > 0,
		closed:  make(chan struct{}),
		rng:     rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		faults:  opts.Faults,
		tasks:   map[string]*task{},
		byLease: map[string]*task{},
		dups:    map[string][]dup{},
		issued:  map[string]time.Time{},
		jtis:    map[string]time.Time{},
		wake:    make(chan struct{}),
		release: make(chan struct{}),
		holding: make(chan struct{}),
		stats:   Stats{Requests: map[Endpoint]int{}, Statuses: map[int]int{}},
	}
	s.ts = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	return s
}

// Start starts serving HTTPS on a port of 127.0.0.1.
func (s *Server) Start() { s.ts.StartTLS() }

// URL is the server's base URL, https://127.0.0.1:<port>, valid once
// started. It is also the audience a JWT must name.
func (s *Server) URL() string { return s.ts.URL }

// Client returns an HTTP client that trusts the server's certificate.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// CAFile writes the server's certificate, which is its own CA, as PEM to
// orchestrator-ca.pem in dir and returns the file's path, for a dispatcher
// running as another process to trust. The server must be started.
func (s *Server) CAFile(dir string) (string, error) {
	cert := s.ts.Certificate()
	if cert == nil {
		return "", fmt.Errorf("orchestratortest: server not started")
	}
	path := filepath.Join(dir, "orchestrator-ca.pem")
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// Close ends held polls, then shuts the server down and waits for the
// requests in flight.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closed) })
	s.ts.Close()
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf("orchestratortest: "+format, args...)
	}
}

// leaseDuration is the lifetime of a lease or a renewal.
func (s *Server) leaseDuration() time.Duration {
	return time.Duration(s.opts.LeaseSeconds) * time.Second
}

// supported is the answer to a request without a supported version.
var supported = orchestrator.ErrorBody{
	Code:    orchestrator.CodeVersion,
	Message: "supported protocol versions: " + orchestrator.Version,
}

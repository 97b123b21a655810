package orchestrator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"
)

func writeKey(t *testing.T, k any) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "runner.key")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestJWTIsSignedAndVerifiable(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := LoadEd25519Key(writeKey(t, priv))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	a := &JWT{Key: key, KeyID: "k1", Subject: "d-1", Audience: "https://orch.example", Now: func() time.Time { return now }}
	tok, err := a.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := jwt.Parse([]byte(tok), jwt.WithKey(jwa.EdDSA(), pub), jwt.WithClock(jwt.ClockFunc(func() time.Time { return now })),
		jwt.WithAudience("https://orch.example"), jwt.WithSubject("d-1"), jwt.WithIssuer("d-1"))
	if err != nil {
		t.Fatalf("verifying: %v", err)
	}
	iat, _ := parsed.IssuedAt()
	nbf, _ := parsed.NotBefore()
	if exp, _ := parsed.Expiration(); exp.Sub(iat) != 5*time.Minute || now.Sub(iat) != JWTSkew || !nbf.Equal(iat) {
		t.Errorf("iat %v, nbf %v, exp %v: want iat = nbf = now - %v, exp 5m after iat", iat, nbf, exp, JWTSkew)
	}
	if id, ok := parsed.JwtID(); !ok || id == "" {
		t.Error("no jti")
	}
	msg, err := jws.Parse([]byte(tok))
	if err != nil {
		t.Fatal(err)
	}
	if kid, _ := msg.Signatures()[0].ProtectedHeaders().KeyID(); kid != "k1" {
		t.Errorf("kid %q", kid)
	}
	// One token per request, each with a jti of its own, at the same
	// instant too: an orchestrator refuses a jti it has seen.
	jtis := map[string]bool{}
	for range 100 {
		again, err := a.Token(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p, err := jwt.Parse([]byte(again), jwt.WithKey(jwa.EdDSA(), pub), jwt.WithValidate(false))
		if err != nil {
			t.Fatal(err)
		}
		id, _ := p.JwtID()
		if jtis[id] {
			t.Fatalf("jti %q signed twice", id)
		}
		jtis[id] = true
	}
	// Another key does not verify it.
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := jwt.Parse([]byte(tok), jwt.WithKey(jwa.EdDSA(), otherPub), jwt.WithValidate(false)); err == nil {
		t.Error("a token verified with the wrong key")
	}
}

// TestJWTAlwaysCarriesAKid: without KeyID the token's kid is the dispatcher
// ID (the --orchestrator-key-id default), never absent: the orchestrator
// finds the key to verify it by its kid, and refuses a token without one.
func TestJWTAlwaysCarriesAKid(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := (&JWT{Key: priv, Subject: "d-7", Audience: "https://orch.example"}).Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	msg, err := jws.Parse([]byte(tok))
	if err != nil {
		t.Fatal(err)
	}
	if kid, ok := msg.Signatures()[0].ProtectedHeaders().KeyID(); !ok || kid != "d-7" {
		t.Errorf("kid %q (present %v), want the dispatcher ID d-7", kid, ok)
	}
}

func TestLoadEd25519KeyErrors(t *testing.T) {
	t.Parallel()
	if _, err := LoadEd25519Key(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing key file loaded")
	}
	junk := filepath.Join(t.TempDir(), "junk")
	_ = os.WriteFile(junk, []byte("not pem"), 0o600)
	if _, err := LoadEd25519Key(junk); err == nil || !strings.Contains(err.Error(), "no PEM block") {
		t.Errorf("junk key: %v", err)
	}
}

func TestTokenFileIsReadAgainWhenItChanges(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &TokenFile{Path: p}
	if tok, err := f.Token(context.Background()); err != nil || tok != "first" {
		t.Fatalf("token %q, %v", tok, err)
	}
	if err := os.WriteFile(p, []byte("second-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, _ := f.Token(context.Background()); tok != "second-token" {
		t.Errorf("after a change: %q", tok)
	}
	_ = os.WriteFile(p, nil, 0o600)
	if _, err := f.Token(context.Background()); err == nil {
		t.Error("an empty token file gave a token")
	}
}

func TestBackoffIsCappedWithFullJitter(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Second, Max: 8 * time.Second}
	for n := range 10 {
		ceiling := min(time.Second<<n, 8*time.Second)
		var maxSeen time.Duration
		for range 200 {
			d := b.Delay(n, nil)
			if d < 0 || d > ceiling {
				t.Fatalf("retry %d: %v outside [0, %v]", n, d, ceiling)
			}
			maxSeen = max(maxSeen, d)
		}
		if maxSeen < ceiling/2 {
			t.Errorf("retry %d: longest of 200 waits %v, ceiling %v: no spread", n, maxSeen, ceiling)
		}
	}
	// Retry-After wins when longer, within the cap.
	err := &Error{Status: http.StatusServiceUnavailable, RetryAfter: 5 * time.Second}
	if d := b.Delay(0, err); d != 5*time.Second {
		t.Errorf("Retry-After 5s: waited %v", d)
	}
	err.RetryAfter = time.Hour
	if d := b.Delay(0, err); d != 8*time.Second {
		t.Errorf("Retry-After 1h: waited %v, want the cap", d)
	}
}

func TestErrorClasses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err                          error
		retry, fatal, gone, conflict bool
	}{
		{err: errors.New("dial tcp: connection refused"), retry: true},
		{err: &Error{Status: 503}, retry: true},
		{err: &Error{Status: 429}, retry: true},
		{err: &Error{Status: 401}, fatal: true},
		{err: &Error{Status: 403, Code: CodeForbidden}, fatal: true},
		{err: &Error{Status: 403}, fatal: true},
		{err: &Error{Status: 426}, fatal: true},
		{err: &Error{Status: 410}, gone: true},
		{err: &Error{Status: 409, Code: CodeStaleLease}, conflict: true},
		// Another dispatcher holds the lease: not this one's any more, like
		// a stale or gone lease; never retried, and no reason to stop.
		{err: fmt.Errorf("reporting: %w", &Error{Status: 403, Code: CodeNotLeaseHolder}), gone: true, conflict: true},
		{err: &Error{Status: 400}},
		{err: context.Canceled},
	} {
		if IsRetryable(tt.err) != tt.retry || IsFatal(tt.err) != tt.fatal || IsGone(tt.err) != tt.gone || IsConflict(tt.err) != tt.conflict {
			t.Errorf("%v: retry %v fatal %v gone %v conflict %v", tt.err, IsRetryable(tt.err), IsFatal(tt.err), IsGone(tt.err), IsConflict(tt.err))
		}
	}
}

func TestNewClientChecksItsOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []ClientOptions{
		{URL: "http://orch.example", DispatcherID: "d"},
		{URL: "orch.example", DispatcherID: "d"},
		{URL: "https://orch.example"},
		{URL: "https://orch.example", DispatcherID: "d", CAFile: "/nonexistent"},
		{URL: "https://orch.example", DispatcherID: "d", Proxy: "::"},
	} {
		if _, err := NewClient(o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

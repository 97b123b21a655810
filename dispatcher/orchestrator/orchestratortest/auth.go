package orchestratortest

import (
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
)

// maxJWTLifetime is the longest exp - iat the protocol allows.
const maxJWTLifetime = 5 * time.Minute

// authenticate checks a request's bearer credentials against the
// configured authentication, if any, and returns the dispatcher they stand
// for: a JWT's sub, or Options.DispatcherID for a static or exchanged
// token. Empty means no one dispatcher (no authentication, or a token bound
// to none), and the lease holder checks are skipped.
func (s *Server) authenticate(r *http.Request) (string, error) {
	o := &s.opts
	if len(o.PublicKey) == 0 && o.Token == "" && o.ServiceAccountToken == "" {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || cred == "" {
		return "", errors.New("missing bearer token")
	}
	switch {
	case len(o.PublicKey) > 0:
		return s.verifyJWT(cred)
	case o.Token != "":
		if subtle.ConstantTimeCompare([]byte(cred), []byte(o.Token)) != 1 {
			return "", errors.New("wrong bearer token")
		}
		return o.DispatcherID, nil
	default:
		s.mu.Lock()
		exp, ok := s.issued[cred]
		s.mu.Unlock()
		if !ok {
			return "", errors.New("unknown access token")
		}
		if !s.clock.Now().Before(exp) {
			return "", errors.New("expired access token")
		}
		return o.DispatcherID, nil
	}
}

// verifyJWT checks a compact JWT as the protocol's Ed25519 authentication
// describes it and returns its sub. Its jti is then spent until the token
// expires: a token sent again (captured, or reused by its dispatcher) is
// refused.
func (s *Server) verifyJWT(raw string) (string, error) {
	if strings.Count(raw, ".") != 2 {
		return "", errors.New("bearer token is not a compact JWT")
	}
	msg, err := jws.ParseString(raw)
	if err != nil {
		return "", fmt.Errorf("bad JWT: %w", err)
	}
	sigs := msg.Signatures()
	if len(sigs) != 1 {
		return "", errors.New("bad JWT: want one signature")
	}
	if alg, ok := sigs[0].ProtectedHeaders().Algorithm(); !ok || alg.String() != "EdDSA" {
		return "", fmt.Errorf("bad JWT: alg %q, want EdDSA", alg.String())
	}
	tok, err := jwt.ParseString(raw,
		jwt.WithKey(jwa.EdDSA(), s.opts.PublicKey),
		jwt.WithAudience(s.URL()),
		jwt.WithRequiredClaim(jwt.ExpirationKey),
		jwt.WithRequiredClaim(jwt.IssuedAtKey),
		jwt.WithRequiredClaim(jwt.JwtIDKey),
		jwt.WithMaxDelta(maxJWTLifetime, jwt.ExpirationKey, jwt.IssuedAtKey),
		jwt.WithClock(jwt.ClockFunc(s.clock.Now)),
	)
	if err != nil {
		return "", fmt.Errorf("bad JWT: %w", err)
	}
	sub, ok := tok.Subject()
	if !ok || sub == "" {
		return "", errors.New("bad JWT: no sub")
	}
	jti, _ := tok.JwtID()
	exp, _ := tok.Expiration()
	if err := s.spendJTI(jti, exp, s.clock.Now()); err != nil {
		return "", err
	}
	return sub, nil
}

// spendJTI records a JWT's jti until exp, refusing one already recorded:
// every request carries a token of its own. Expired entries are dropped at
// most once a second, so the map holds the tokens of the last 5 minutes.
func (s *Server) spendJTI(jti string, exp, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.pruned) >= time.Second {
		for id, until := range s.jtis {
			if !now.Before(until) {
				delete(s.jtis, id)
			}
		}
		s.pruned = now
	}
	if until, ok := s.jtis[jti]; ok && now.Before(until) {
		s.stats.Replayed++
		return fmt.Errorf("bad JWT: jti %q was already used; sign a new token for every request", jti)
	}
	s.jtis[jti] = exp
	return nil
}

// token is the token exchange endpoint.
func (s *Server) token(w http.ResponseWriter, r *http.Request, _ string) {
	if s.opts.ServiceAccountToken == "" {
		writeError(w, http.StatusNotFound, codeNotFound, "token exchange is not enabled")
		return
	}
	var req orchestrator.TokenRequest
	if !decode(w, r, &req) {
		return
	}
	if subtle.ConstantTimeCompare([]byte(req.Token), []byte(s.opts.ServiceAccountToken)) != 1 {
		s.mu.Lock()
		s.stats.Unauthorized++
		s.mu.Unlock()
		writeError(w, http.StatusUnauthorized, orchestrator.CodeUnauthorized, "service-account token refused")
		return
	}
	ttl := s.opts.ExchangeTTL
	access := rand.Text()
	s.mu.Lock()
	s.issued[access] = s.clock.Now().Add(ttl)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, orchestrator.TokenResponse{
		AccessToken: access,
		TokenType:   "Bearer",
		ExpiresIn:   max(1, int((ttl+time.Second-1)/time.Second)),
	})
}

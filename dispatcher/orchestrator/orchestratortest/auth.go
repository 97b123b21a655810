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
// configured authentication, if any.
func (s *Server) authenticate(r *http.Request) error {
	o := &s.opts
	if len(o.PublicKey) == 0 && o.Token == "" && o.ServiceAccountToken == "" {
		return nil
	}
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || cred == "" {
		return errors.New("missing bearer token")
	}
	switch {
	case len(o.PublicKey) > 0:
		return s.verifyJWT(cred)
	case o.Token != "":
		if subtle.ConstantTimeCompare([]byte(cred), []byte(o.Token)) != 1 {
			return errors.New("wrong bearer token")
		}
		return nil
	default:
		s.mu.Lock()
		exp, ok := s.issued[cred]
		s.mu.Unlock()
		if !ok {
			return errors.New("unknown access token")
		}
		if !s.clock.Now().Before(exp) {
			return errors.New("expired access token")
		}
		return nil
	}
}

// verifyJWT checks a compact JWT as the protocol's Ed25519 authentication
// describes it.
func (s *Server) verifyJWT(raw string) error {
	if strings.Count(raw, ".") != 2 {
		return errors.New("bearer token is not a compact JWT")
	}
	msg, err := jws.ParseString(raw)
	if err != nil {
		return fmt.Errorf("bad JWT: %w", err)
	}
	sigs := msg.Signatures()
	if len(sigs) != 1 {
		return errors.New("bad JWT: want one signature")
	}
	if alg, ok := sigs[0].ProtectedHeaders().Algorithm(); !ok || alg.String() != "EdDSA" {
		return fmt.Errorf("bad JWT: alg %q, want EdDSA", alg.String())
	}
	tok, err := jwt.ParseString(raw,
		jwt.WithKey(jwa.EdDSA(), s.opts.PublicKey),
		jwt.WithAudience(s.URL()),
		jwt.WithRequiredClaim(jwt.ExpirationKey),
		jwt.WithRequiredClaim(jwt.IssuedAtKey),
		jwt.WithMaxDelta(maxJWTLifetime, jwt.ExpirationKey, jwt.IssuedAtKey),
		jwt.WithClock(jwt.ClockFunc(s.clock.Now)),
	)
	if err != nil {
		return fmt.Errorf("bad JWT: %w", err)
	}
	if sub, ok := tok.Subject(); !ok || sub == "" {
		return errors.New("bad JWT: no sub")
	}
	return nil
}

// token is the token exchange endpoint.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
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

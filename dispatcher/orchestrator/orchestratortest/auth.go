package orchestratortest

import (
	"crypto/ed25519"
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

// dispatcherKey is a dispatcher's Ed25519 key: a JWT it verifies acts for
// id alone. id is empty for Options.PublicKey until a token binds it.
type dispatcherKey struct {
	id  string
	key ed25519.PublicKey
}

// addKey registers a dispatcher's key under kid, panicking on a kid
// registered before: one kid names one key of one dispatcher.
func addKey(keys map[string]*dispatcherKey, id, kid string, key ed25519.PublicKey) {
	checkKey(key)
	if prev, ok := keys[kid]; ok {
		panic(fmt.Sprintf("orchestratortest: kid %q names keys of both %s and %s", kid, prev.id, id))
	}
	keys[kid] = &dispatcherKey{id: id, key: key}
}

func checkKey(key ed25519.PublicKey) {
	if len(key) != ed25519.PublicKeySize {
		panic("orchestratortest: a PublicKey that is not an Ed25519 public key")
	}
}

// addToken registers a static token of dispatcher id, panicking on a token
// registered before: a token stands for one dispatcher.
func addToken(tokens map[string]string, id, token string) {
	if prev, ok := tokens[token]; ok {
		panic(fmt.Sprintf("orchestratortest: one static token for both %s and %s", prev, id))
	}
	tokens[token] = id
}

// authenticate checks a request's bearer credentials and returns the one
// dispatcher they stand for: the dispatcher whose key the JWT's kid names
// (its sub must be that dispatcher), the dispatcher of a static token, or
// Options.DispatcherID for an exchanged token. With no credentials
// configured it returns "", and the lease holder checks are skipped.
func (s *Server) authenticate(r *http.Request) (string, error) {
	if s.open {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || cred == "" {
		return "", errors.New("missing bearer token")
	}
	// Every static token is compared, in constant time, whichever matches.
	id := ""
	for token, d := range s.tokens {
		if subtle.ConstantTimeCompare([]byte(cred), []byte(token)) == 1 {
			id = d
		}
	}
	switch {
	case id != "":
		return id, nil
	case s.hasKeys && strings.Count(cred, ".") == 2:
		return s.verifyJWT(cred)
	case s.opts.ServiceAccountToken != "":
		s.mu.Lock()
		exp, ok := s.issued[cred]
		s.mu.Unlock()
		if !ok {
			return "", errors.New("unknown access token")
		}
		if !s.clock.Now().Before(exp) {
			return "", errors.New("expired access token")
		}
		return s.opts.DispatcherID, nil
	case s.hasKeys:
		return "", errors.New("bearer token is not a compact JWT")
	}
	return "", errors.New("wrong bearer token")
}

// verifyJWT checks a compact JWT as the protocol's Ed25519 authentication
// describes it and returns the dispatcher it acts for: the one whose key its
// kid names, which must be its sub. Its jti is then spent until the token
// expires: a token sent again (captured, or reused by its dispatcher) is
// refused.
func (s *Server) verifyJWT(raw string) (string, error) {
	msg, err := jws.ParseString(raw)
	if err != nil {
		return "", fmt.Errorf("bad JWT: %w", err)
	}
	sigs := msg.Signatures()
	if len(sigs) != 1 {
		return "", errors.New("bad JWT: want one signature")
	}
	hdr := sigs[0].ProtectedHeaders()
	if alg, ok := hdr.Algorithm(); !ok || alg.String() != "EdDSA" {
		return "", fmt.Errorf("bad JWT: alg %q, want EdDSA", alg.String())
	}
	kid, _ := hdr.KeyID()
	if kid == "" {
		return "", errors.New("bad JWT: no kid in its header: the orchestrator finds a dispatcher's key by its kid (--orchestrator-key-id)")
	}
	s.mu.Lock()
	k, known := s.keys[kid]
	if !known {
		k = s.keys[""] // Options.PublicKey, not bound yet
	}
	var dk dispatcherKey
	if k != nil {
		dk = *k
	}
	s.mu.Unlock()
	if k == nil {
		return "", fmt.Errorf("bad JWT: unknown kid %q: no dispatcher's key is registered under it", kid)
	}
	tok, err := jwt.ParseString(raw,
		jwt.WithKey(jwa.EdDSA(), dk.key),
		jwt.WithAudience(s.URL()),
		jwt.WithRequiredClaim(jwt.ExpirationKey),
		jwt.WithRequiredClaim(jwt.IssuedAtKey),
		jwt.WithRequiredClaim(jwt.JwtIDKey),
		jwt.WithMaxDelta(maxJWTLifetime, jwt.ExpirationKey, jwt.IssuedAtKey),
		jwt.WithClock(jwt.ClockFunc(s.clock.Now)),
	)
	if err != nil {
		return "", fmt.Errorf("bad JWT (kid %q): %w", kid, err)
	}
	sub, ok := tok.Subject()
	if !ok || sub == "" {
		return "", errors.New("bad JWT: no sub")
	}
	if !known {
		// The first token of the unbound Options.PublicKey binds it, and
		// its kid, to its sub; a concurrent first token may have won.
		s.mu.Lock()
		if s.keys[""] == k {
			delete(s.keys, "")
			s.keys[kid] = &dispatcherKey{id: sub, key: dk.key}
			dk.id = sub
		} else if b, ok := s.keys[kid]; ok && b.key.Equal(dk.key) {
			dk.id = b.id
		} else {
			s.mu.Unlock()
			return "", fmt.Errorf("bad JWT: unknown kid %q: no dispatcher's key is registered under it", kid)
		}
		s.mu.Unlock()
	}
	if sub != dk.id {
		return "", fmt.Errorf("bad JWT: sub %q, but the key of kid %q is dispatcher %q's: a dispatcher signs only for itself", sub, kid, dk.id)
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

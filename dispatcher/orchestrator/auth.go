package orchestrator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"
)

// Authenticator gives the bearer token for the next request.
type Authenticator interface {
	// Token returns the token to send; empty sends none.
	Token(ctx context.Context) (string, error)
	// Invalidate drops a cached token the orchestrator refused.
	Invalidate()
}

type noAuth struct{}

func (noAuth) Token(context.Context) (string, error) { return "", nil }
func (noAuth) Invalidate()                           {}

// JWTSkew is how far the dispatcher's clock may run ahead of the
// orchestrator's: each token's iat and nbf are set this far in the past, so
// an orchestrator that checks them strictly (no leeway) still takes it.
const JWTSkew = time.Minute

// JWT signs a short-lived token for every request with the dispatcher's
// Ed25519 private key: header {"alg": "EdDSA", "typ": "JWT", "kid": KeyID},
// claims iss and sub (the dispatcher ID), aud (the orchestrator URL), iat
// and nbf (Skew in the past), exp (TTL after iat) and a random jti of its
// own. One token per request lets the orchestrator refuse a jti it has seen
// (a captured token sent again); signing costs tens of microseconds.
type JWT struct {
	Key ed25519.PrivateKey
	// KeyID is the kid: the name the orchestrator registered this
	// dispatcher's public key under. The orchestrator verifies the token
	// with that key alone and takes sub only if the key is registered for
	// it, so one dispatcher's key cannot sign for another. Default:
	// Subject, what dispatchers have always sent by default
	// (--orchestrator-key-id), so every token carries a kid.
	KeyID string
	// Subject is the dispatcher ID, sent as iss and sub.
	Subject  string
	Audience string
	// TTL is each token's lifetime, from iat to exp; the protocol allows at
	// most 5m. Default: 5m.
	TTL time.Duration
	// Skew is how far in the past iat and nbf are set. Default: JWTSkew.
	Skew time.Duration
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

// LoadEd25519Key reads an Ed25519 private key in PKCS #8 PEM, as
// `openssl genpkey -algorithm ed25519` writes it.
func LoadEd25519Key(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the private key: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("private key %s: no PEM block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("private key %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key %s: a %T, not Ed25519 (make one with: openssl genpkey -algorithm ed25519)", path, k)
	}
	return ek, nil
}

// Token signs a new token, with a jti of its own.
func (j *JWT) Token(context.Context) (string, error) {
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	ttl := j.TTL
	if ttl <= 0 {
		ttl = 5 * time.Minute
	}
	skew := j.Skew
	if skew <= 0 {
		skew = JWTSkew
	}
	iat := now().Add(-skew)
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", fmt.Errorf("drawing the token's jti: %w", err)
	}
	tok, err := jwt.NewBuilder().
		Issuer(j.Subject).Subject(j.Subject).Audience([]string{j.Audience}).
		IssuedAt(iat).NotBefore(iat).Expiration(iat.Add(ttl)).JwtID(hex.EncodeToString(id[:])).Build()
	if err != nil {
		return "", err
	}
	hdr := jws.NewHeaders()
	kid := j.KeyID
	if kid == "" {
		kid = j.Subject
	}
	if err := hdr.Set(jws.KeyIDKey, kid); err != nil {
		return "", err
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.EdDSA(), j.Key, jws.WithProtectedHeaders(hdr)))
	if err != nil {
		return "", fmt.Errorf("signing the token: %w", err)
	}
	return string(signed), nil
}

// Invalidate implements Authenticator: there is no cached token to drop.
func (*JWT) Invalidate() {}

// TokenFile is a static bearer token read from a file (a mounted Secret),
// read again when the file changes.
type TokenFile struct {
	Path string

	mu    sync.Mutex
	token string
	mtime time.Time
	size  int64
}

// Token implements Authenticator.
func (f *TokenFile) Token(context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := os.Stat(f.Path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if f.token != "" && st.ModTime().Equal(f.mtime) && st.Size() == f.size {
		return f.token, nil
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", f.Path)
	}
	f.token, f.mtime, f.size = t, st.ModTime(), st.Size()
	return t, nil
}

// Invalidate implements Authenticator.
func (f *TokenFile) Invalidate() {
	f.mu.Lock()
	f.token = ""
	f.mu.Unlock()
}

// Exchange trades the projected service-account token in a file for an
// orchestrator token at POST /v1/auth/token, and trades again when that
// token is close to expiry. The file is read at each exchange, so the
// kubelet's rotation of it is picked up.
type Exchange struct {
	// Path of the projected service-account token.
	Path string
	// Now is the clock. Default: time.Now.
	Now func() time.Time

	client  *Client
	mu      sync.Mutex
	token   string
	expires time.Time
}

// Token implements Authenticator.
func (x *Exchange) Token(ctx context.Context) (string, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	now := time.Now
	if x.Now != nil {
		now = x.Now
	}
	if x.token != "" && x.expires.Sub(now()) > 30*time.Second {
		return x.token, nil
	}
	if x.client == nil {
		return "", errors.New("token exchange: not attached to a client")
	}
	b, err := os.ReadFile(x.Path)
	if err != nil {
		return "", fmt.Errorf("service account token: %w", err)
	}
	var resp TokenResponse
	if err := x.client.post(ctx, PathToken, "", TokenRequest{Token: strings.TrimSpace(string(b))}, &resp, 30*time.Second); err != nil {
		return "", fmt.Errorf("token exchange: %w", err)
	}
	if resp.AccessToken == "" || resp.ExpiresIn <= 0 {
		return "", errors.New("token exchange: the response has no access_token or expires_in")
	}
	x.token, x.expires = resp.AccessToken, now().Add(time.Duration(resp.ExpiresIn)*time.Second)
	return x.token, nil
}

// Invalidate implements Authenticator.
func (x *Exchange) Invalidate() {
	x.mu.Lock()
	x.token = ""
	x.mu.Unlock()
}

package resolve

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/security/keyvault/azsecrets"
)

// staticToken is a credential that hands out one token, recording the
// scopes asked for.
type staticToken struct {
	token  string
	mu     sync.Mutex
	scopes []string
}

func (s *staticToken) GetToken(_ context.Context, o policy.TokenRequestOptions) (azcore.AccessToken, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scopes = append(s.scopes, o.Scopes...)
	return azcore.AccessToken{Token: s.token, ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// fakeKeyVault answers Key Vault's getSecret as the service does: a
// request without a token gets the bearer challenge, one with the test's
// token its secret.
func fakeKeyVault(t *testing.T, secrets map[string]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail := func(code int, what string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": what, "message": what}})
		}
		switch r.Header.Get("Authorization") {
		case "":
			w.Header().Set("WWW-Authenticate", `Bearer authorization="https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47", resource="https://vault.azure.net"`)
			fail(http.StatusUnauthorized, "Unauthorized")
			return
		case "Bearer azure-test-token":
		default:
			fail(http.StatusUnauthorized, "Unauthorized")
			return
		}
		name, ok := strings.CutPrefix(strings.TrimSuffix(r.URL.Path, "/"), "/secrets/")
		if r.Method != http.MethodGet || !ok || r.URL.Query().Get("api-version") == "" {
			fail(http.StatusBadRequest, "BadParameter")
			return
		}
		if name == "denied" {
			fail(http.StatusForbidden, "Forbidden")
			return
		}
		v, ok := secrets[name]
		if !ok {
			fail(http.StatusNotFound, "SecretNotFound")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"value": v, "id": "https://" + r.Host + "/secrets/" + name + "/0123", "attributes": map[string]any{"enabled": true}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Through Azure's own SDK against a server that answers as Key Vault does
// (the bearer challenge, then the token): a secret, the token asked for
// Key Vault's scope, and failures classified.
func TestAzureKeyVault(t *testing.T) {
	t.Parallel()
	srv := fakeKeyVault(t, map[string]string{"db-password": "s3cr3t"})
	var vaults []string
	store := func(token string) (*Azure, *staticToken) {
		cred := &staticToken{token: token}
		opts := azsecrets.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: srv.Client()}, DisableChallengeResourceVerification: true}
		return NewAzureWith(cred, opts, func(vault string) string { vaults = append(vaults, vault); return srv.URL }), cred
	}
	a, cred := store("azure-test-token")
	for _, c := range []struct {
		name, want string
		err        error
	}{
		{"db-password", "s3cr3t", nil},
		{"none", "", ErrNotFound},
		{"denied", "", ErrDenied},
	} {
		got, err := a.Fetch(t.Context(), Ref{Store: "azure", Name: c.name, Vault: "kv-team-a"})
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("Fetch(%s) = %q, %v; want %q, %v", c.name, got, err, c.want, c.err)
		}
	}
	if len(vaults) != 1 || vaults[0] != "kv-team-a" {
		t.Errorf("vault clients made for %q, want one for kv-team-a", vaults)
	}
	if len(cred.scopes) == 0 || cred.scopes[0] != "https://vault.azure.net/.default" {
		t.Errorf("token scopes asked for %q, want Key Vault's", cred.scopes)
	}
	other, _ := store("another-token")
	if _, err := other.Fetch(t.Context(), Ref{Store: "azure", Name: "db-password", Vault: "kv-team-a"}); !errors.Is(err, ErrDenied) {
		t.Errorf("another token: %v, want refused", err)
	}
}

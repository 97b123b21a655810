package resolve

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Vault's namespaces are an Enterprise feature the e2e suite's dev server
// ignores: this server answers as a Vault Enterprise with namespaces does,
// keyed by the X-Vault-Namespace header the client sends, so the reference's
// @namespace (else VAULT_NAMESPACE) is checked to reach Vault.
func TestVaultNamespaces(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ns := r.Header.Get("X-Vault-Namespace")
		mu.Lock()
		seen = append(seen, ns+" "+r.URL.Path)
		mu.Unlock()
		if r.Header.Get("X-Vault-Token") != "t0ken" {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]any{"errors": []string{"permission denied"}})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/sys/internal/ui/mounts/secret/db":
			_ = json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{"path": "secret/", "options": map[string]any{"version": "2"}}})
		case "/v1/secret/data/db":
			_ = json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{"data": map[string]any{"password": "in " + strings.TrimSuffix(ns, "/")}}})
		default:
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]any{"errors": []string{}})
		}
	}))
	t.Cleanup(srv.Close)
	v, err := NewVault(t.Context(), VaultOptions{Address: srv.URL, Token: "t0ken", Namespace: "platform"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ns, want string }{{"team-a", "in team-a"}, {"", "in platform"}} {
		got, err := v.Fetch(t.Context(), Ref{Store: "vault", Name: "secret/db", Key: "password", Vault: c.ns})
		if err != nil || got != c.want {
			t.Errorf("namespace %q: %q, %v; want %q", c.ns, got, err, c.want)
		}
	}
	if _, err := v.Fetch(t.Context(), Ref{Store: "vault", Name: "secret/none", Key: "password", Vault: "team-a"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("a path under no mount: %v, want not found", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.HasPrefix(seen[0], "team-a ") || !strings.HasPrefix(seen[2], "platform ") {
		t.Errorf("requests %q: the reference's namespace, else the default, goes in X-Vault-Namespace", seen)
	}
}

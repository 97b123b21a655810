package resolve

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
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
			_ = json.NewEncoder(w).Encode(map[string]any{"data": map[string]any{"path": "secret/", "type": "kv", "options": map[string]any{"version": "2"}}})
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

// A reference reads only a key-value secret under a mount the platform
// names, or a mount of another engine it names as such: Vault's own paths
// (the resolver's token, identity tokens, its cubbyhole), a path under no
// named mount, a mount of another type at a named path, and a path whose
// mount Vault cannot tell are refused, and no read of them is ever sent.
func TestVaultReadsOnlyNamedMounts(t *testing.T) {
	t.Parallel()
	mounts := map[string]map[string]any{
		"secret/":  {"path": "secret/", "type": "kv", "options": map[string]any{"version": "2"}},
		"kv1/":     {"path": "kv1/", "type": "kv", "options": map[string]any{"version": "1"}},
		"transit/": {"path": "transit/", "type": "transit"},
		"db/":      {"path": "db/", "type": "database"},
		"shared/":  {"path": "shared/team/", "type": "kv"}, // a mount nested under a named path
	}
	tests := []struct {
		name, path, want string
		err              error
		reads            []string // the paths read, sys/internal/ui/mounts aside
	}{
		{name: "kv v2", path: "secret/app", want: "v:secret/data/app", reads: []string{"/v1/secret/data/app"}},
		{name: "kv v1", path: "kv1/app", want: "v:kv1/app", reads: []string{"/v1/kv1/app"}},
		{name: "a named engine mount", path: "db/creds/ro", want: "v:db/creds/ro", reads: []string{"/v1/db/creds/ro"}},
		{name: "the resolver's own token", path: "auth/token/lookup-self", err: ErrRefused},
		{name: "an identity token", path: "identity/oidc/token/role", err: ErrRefused},
		{name: "the cubbyhole", path: "cubbyhole/x", err: ErrRefused},
		{name: "sys", path: "sys/config/state/sanitized", err: ErrRefused},
		{name: "a mount the platform does not name", path: "other/app", err: ErrRefused},
		{name: "a named kv mount that is another engine", path: "transit/keys/k", err: ErrRefused},
		{name: "a mount nested under a named one", path: "shared/team/app", err: ErrRefused},
		{name: "a mount Vault cannot tell: no guess", path: "secret/none", err: ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var reads []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if p, ok := strings.CutPrefix(r.URL.Path, "/v1/sys/internal/ui/mounts/"); ok {
					for prefix, m := range mounts {
						if strings.HasPrefix(p, prefix) && p != "secret/none" {
							_ = json.NewEncoder(w).Encode(map[string]any{"data": m})
							return
						}
					}
					w.WriteHeader(http.StatusNotFound)
					_ = json.NewEncoder(w).Encode(map[string]any{"errors": []string{}})
					return
				}
				mu.Lock()
				reads = append(reads, r.URL.Path)
				mu.Unlock()
				data := map[string]any{"k": "v:" + strings.TrimPrefix(r.URL.Path, "/v1/")}
				if strings.HasPrefix(r.URL.Path, "/v1/secret/data/") {
					data = map[string]any{"data": data}
				}
				_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
			}))
			t.Cleanup(srv.Close)
			v, err := NewVault(t.Context(), VaultOptions{Address: srv.URL, Token: "t", KVMounts: []string{"secret", "kv1/", "transit", "shared"}, EngineMounts: []string{"db"}})
			if err != nil {
				t.Fatal(err)
			}
			got, err := v.Fetch(t.Context(), Ref{Store: "vault", Name: tc.path, Key: "k"})
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Errorf("Fetch(%s) = %q, %v; want %v", tc.path, got, err, tc.err)
				}
			} else if err != nil || got != tc.want {
				t.Errorf("Fetch(%s) = %q, %v; want %q", tc.path, got, err, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(tc.reads, reads); diff != "" {
				t.Errorf("paths read (-want +got):\n%s", diff)
			}
		})
	}
}

// The platform cannot name Vault's own paths as mounts to read.
func TestVaultRefusesReservedMounts(t *testing.T) {
	t.Parallel()
	for _, o := range []VaultOptions{
		{Address: "http://127.0.0.1:1", Token: "t", KVMounts: []string{"auth"}},
		{Address: "http://127.0.0.1:1", Token: "t", EngineMounts: []string{"identity/oidc"}},
		{Address: "http://127.0.0.1:1", Token: "t", EngineMounts: []string{"/sys/"}},
		{Address: "http://127.0.0.1:1", Token: "t", KVMounts: []string{"cubbyhole"}},
	} {
		if _, err := NewVault(t.Context(), o); err == nil || !strings.Contains(err.Error(), "Vault's own paths") {
			t.Errorf("NewVault(%v, %v) = %v, want a refusal", o.KVMounts, o.EngineMounts, err)
		}
	}
	o := VaultOptionsFromEnv(func(k string) string {
		return map[string]string{"VAULT_ADDR": "http://x", "VAULT_KV_MOUNTS": "secret, kv1/,", "VAULT_ENGINE_MOUNTS": "db"}[k]
	})
	if diff := cmp.Diff([]string{"secret", "kv1"}, o.KVMounts); diff != "" {
		t.Errorf("VAULT_KV_MOUNTS (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"db"}, o.EngineMounts); diff != "" {
		t.Errorf("VAULT_ENGINE_MOUNTS (-want +got):\n%s", diff)
	}
}

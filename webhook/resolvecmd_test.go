package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runwarden/runwarden/internal/resolve"
)

// The resolve command's failures reach the termination message, naming the
// variable and the reference; a store it cannot read says so.
func TestResolveCommandFailures(t *testing.T) {
	t.Parallel()
	plan := func(vars []resolve.Var) string {
		b, err := json.Marshal(vars)
		if err != nil {
			t.Fatal(err)
		}
		return base64.StdEncoding.EncodeToString(b)
	}
	ssm := resolve.Ref{Store: "ssm", Name: "/prod/db", Raw: "${ssm:/prod/db}"}
	azure := resolve.Ref{Store: "azure", Name: "db", Vault: "kv1", Raw: "${azure:db@kv1}"}
	vault := resolve.Ref{Store: "vault", Name: "secret/db", Key: "password", Raw: "${vault:secret/db.password@ns}"}
	for _, c := range []struct {
		name, spec string
		env        map[string]string
		want       string
	}{
		{"no plan", "", nil, "reading RUNWARDEN_SECRET_REFS"},
		{"not base64", "{}", nil, "reading RUNWARDEN_SECRET_REFS"},
		{"aws without its region", plan([]resolve.Var{{Key: "RW_0", Container: "main", Env: "DB", Value: ssm.Raw, Refs: []resolve.Ref{ssm}}}), nil,
			`container main env DB: ${ssm:/prod/db}: store "ssm" is not enabled`},
		{"azure without credentials", plan([]resolve.Var{{Key: "RW_0", Container: "main", Env: "DB", Value: azure.Raw, Refs: []resolve.Ref{azure}}}), nil,
			`container main env DB: ${azure:db@kv1}: store "azure" is not enabled`},
		{"a store it does not know", plan([]resolve.Var{{Key: "RW_0", Container: "main", Env: "DB", Value: "${x:y}", Refs: []resolve.Ref{{Store: "x", Name: "y", Raw: "${x:y}"}}}}), nil,
			"container main env DB: ${x:y}: resolving x references is not supported"},
		{"vault without its address", plan([]resolve.Var{{Key: "RW_0", Container: "main", Env: "DB", Value: vault.Raw, Refs: []resolve.Ref{vault}}}), nil,
			`container main env DB: ${vault:secret/db.password@ns}: store "vault" is not enabled`},
		{"vault without credentials", plan([]resolve.Var{{Key: "RW_0", Container: "main", Env: "DB", Value: vault.Raw, Refs: []resolve.Ref{vault}}}),
			map[string]string{"VAULT_ADDR": "http://127.0.0.1:1"}, "vault: no token (VAULT_TOKEN) and no kubernetes auth role (VAULT_AUTH_ROLE)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			term := filepath.Join(dir, "termination-log")
			getenv := func(k string) string {
				if k == resolve.SpecEnv {
					return c.spec
				}
				return c.env[k]
			}
			var stdout, stderr bytes.Buffer
			code := resolveSecrets(t.Context(), []string{"--out", filepath.Join(dir, "secrets.env"), "--termination-log", term}, &stdout, &stderr, getenv)
			if code != 1 {
				t.Fatalf("exit %d, want 1; stderr: %s", code, stderr.String())
			}
			msg, err := os.ReadFile(term)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(msg), c.want) || !strings.HasPrefix(string(msg), "runwarden: resolving secret references: ") {
				t.Errorf("termination message %q, want %q", msg, c.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "secrets.env")); !os.IsNotExist(err) {
				t.Errorf("an env file was written on failure: %v", err)
			}
		})
	}
}

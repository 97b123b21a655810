package resolve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// storeFunc is a Store from a function.
type storeFunc func(context.Context, Ref) (string, error)

func (f storeFunc) Fetch(ctx context.Context, r Ref) (string, error) { return f(ctx, r) }

func TestResolveReplacesEachReferenceWhereItStands(t *testing.T) {
	t.Parallel()
	calls := 0
	vault := storeFunc(func(_ context.Context, r Ref) (string, error) {
		calls++
		// A secret that holds another reference's text stays as it is.
		return map[string]string{"secret/db": "p@ss ${vault:secret/user.name@ns}", "secret/user": "admin"}[r.Name], nil
	})
	db := Ref{Store: "vault", Name: "secret/db", Key: "password", Vault: "ns", Raw: "${vault:secret/db.password@ns}"}
	user := Ref{Store: "vault", Name: "secret/user", Key: "name", Vault: "ns", Raw: "${vault:secret/user.name@ns}"}
	vars := []Var{
		{Key: "RW_0", Container: "main", Env: "DSN", Value: "postgres://" + user.Raw + ":" + db.Raw + "@db/x", Refs: []Ref{user, db}},
		{Key: "RW_1", Container: "main", Env: "PASSWORD", Value: db.Raw, Refs: []Ref{db}},
	}
	got, err := Resolve(t.Context(), vars, map[string]Store{"vault": vault}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"RW_0": "postgres://admin:p@ss ${vault:secret/user.name@ns}@db/x", "RW_1": "p@ss ${vault:secret/user.name@ns}"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("resolved %q, want %q", got, want)
	}
	if calls != 2 {
		t.Errorf("%d fetches for two references, want each fetched once", calls)
	}
}

// A failure names the container, the variable and the reference, never a
// value; an unavailable store is tried again a bounded number of times,
// other failures are not.
func TestResolveFailures(t *testing.T) {
	t.Parallel()
	ref := Ref{Store: "vault", Name: "secret/db", Key: "password", Raw: "${vault:secret/db.password@ns}"}
	vars := []Var{{Key: "RW_0", Container: "main", Env: "TF_VAR_db", Value: "x-" + ref.Raw, Refs: []Ref{ref}}}
	for _, c := range []struct {
		name   string
		err    error
		stores bool
		tries  int
		want   string
	}{
		{"denied", fmt.Errorf("vault: reading secret/data/db: %w", ErrDenied), true, 1, "container main env TF_VAR_db: ${vault:secret/db.password@ns}: vault: reading secret/data/db: access denied"},
		{"missing", fmt.Errorf("vault: the secret has no key: %w", ErrNotFound), true, 1, "not found"},
		{"unavailable", fmt.Errorf("vault: %w", ErrUnavailable), true, 3, "store unavailable (after 3 tries)"},
		{"store not enabled", nil, false, 0, `store "vault" is not enabled in the platform configuration`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tries := 0
			stores := map[string]Store{}
			if c.stores {
				stores["vault"] = storeFunc(func(context.Context, Ref) (string, error) { tries++; return "", c.err })
			}
			_, err := Resolve(t.Context(), vars, stores, Options{Attempts: 3, Backoff: time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "TF_VAR_db") {
				t.Fatalf("error %v, want one naming TF_VAR_db and %q", err, c.want)
			}
			if tries != c.tries {
				t.Errorf("%d tries, want %d", tries, c.tries)
			}
			if c.err != nil && !errors.Is(err, c.err) && !errors.Is(err, errors.Unwrap(c.err)) {
				t.Errorf("error %v does not wrap %v", err, c.err)
			}
		})
	}
}

// The env file is what the kubelet's reader takes: KEY='value', multi-line
// values kept; values it cannot hold are refused by name.
func TestWriteEnvFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, EnvFile)
	vars := []Var{{Key: "RW_0", Container: "main", Env: "A"}, {Key: "RW_1", Container: "main", Env: "PEM"}}
	if err := WriteEnvFile(path, map[string]string{"RW_1": "-----BEGIN-----\nabc\n-----END-----", "RW_0": "s3cr3t $HOME \" \\n"}, vars); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "RW_0='s3cr3t $HOME \" \\n'\nRW_1='-----BEGIN-----\nabc\n-----END-----'\n"; string(b) != want {
		t.Fatalf("env file %q, want %q", b, want)
	}
	for value, want := range map[string]string{
		"":                             "container main env A resolves to an empty value",
		"it's":                         "container main env A resolves to a value holding a single quote",
		"a\x00b":                       "NUL",
		strings.Repeat("x", maxLine+1): "a line longer than",
	} {
		err := WriteEnvFile(filepath.Join(dir, "other.env"), map[string]string{"RW_0": value}, vars)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "it's") {
			t.Errorf("value %.20q: %v, want an error naming the variable (%q) and not the value", value, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "other.env")); !os.IsNotExist(err) {
		t.Errorf("a refused env file was written: %v", err)
	}
}

// Delivery "files" takes any value, the env file's impossible ones too.
func TestWriteFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	values := map[string]string{"RW_0": "it's", "RW_1": "", "RW_2": "a\x00b\nc"}
	if err := WriteFiles(dir, values); err != nil {
		t.Fatal(err)
	}
	for k, want := range values {
		got, err := os.ReadFile(filepath.Join(dir, k))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", k, got, err, want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != len(values) {
		t.Errorf("%d files, want %d: temporary files left", len(entries), len(values))
	}
}

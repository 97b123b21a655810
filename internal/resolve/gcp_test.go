package resolve

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"hash/crc32"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/oauth2"
	"google.golang.org/api/option"
)

// fakeSecretManager answers Secret Manager's REST accessSecretVersion for
// the versions given, checking the path and the bearer token.
func fakeSecretManager(t *testing.T, versions map[string]string, seen *[]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fail := func(code int, status string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": status, "status": status}})
		}
		if r.Header.Get("Authorization") != "Bearer gcp-test-token" {
			fail(http.StatusUnauthorized, "UNAUTHENTICATED")
			return
		}
		name, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v1/"), ":access")
		if r.Method != http.MethodGet || !ok || !strings.HasPrefix(r.URL.Path, "/v1/projects/") {
			fail(http.StatusBadRequest, "INVALID_ARGUMENT")
			return
		}
		*seen = append(*seen, name)
		if strings.Contains(name, "denied") {
			fail(http.StatusForbidden, "PERMISSION_DENIED")
			return
		}
		v, ok := versions[name]
		if !ok {
			fail(http.StatusNotFound, "NOT_FOUND")
			return
		}
		sum := crc32.Checksum([]byte(v), crc32.MakeTable(crc32.Castagnoli))
		if strings.Contains(name, "corrupt") {
			sum++
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"name": name, "payload": map[string]any{
			"data": base64.StdEncoding.EncodeToString([]byte(v)), "dataCrc32c": strconv.FormatUint(uint64(sum), 10),
		}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// Through Google's own client against a server that checks what it sends
// (the path, the bearer token): a secret of the configured project (its
// latest version), a full version name, a checksum that does not match, and
// failures classified.
func TestGCPSecretManager(t *testing.T) {
	t.Parallel()
	var seen []string
	srv := fakeSecretManager(t, map[string]string{
		"projects/p1/secrets/db/versions/latest":      "s3cr3t",
		"projects/p2/secrets/api/versions/3":          "key-3",
		"projects/p1/secrets/corrupt/versions/latest": "x",
	}, &seen)
	token := option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "gcp-test-token"}))
	g, err := NewGCP(t.Context(), "p1", option.WithEndpoint(srv.URL), token)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want, problem string
		err                 error
	}{
		{"db", "s3cr3t", "", nil},
		{"projects/p2/secrets/api/versions/3", "key-3", "", nil},
		{"projects/p2/secrets/api", "", "", ErrNotFound},
		{"denied", "", "", ErrDenied},
		{"corrupt", "", "does not match its checksum", nil},
	} {
		got, err := g.Fetch(t.Context(), Ref{Store: "gcp", Name: c.name})
		switch {
		case c.problem != "":
			if err == nil || !strings.Contains(err.Error(), c.problem) {
				t.Errorf("Fetch(%s) = %q, %v; want %q", c.name, got, err, c.problem)
			}
		case got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil):
			t.Errorf("Fetch(%s) = %q, %v; want %q, %v", c.name, got, err, c.want, c.err)
		}
	}
	if seen[0] != "projects/p1/secrets/db/versions/latest" || seen[2] != "projects/p2/secrets/api/versions/latest" {
		t.Errorf("versions asked for: %q", seen)
	}
	anonymous, err := NewGCP(t.Context(), "p1", option.WithEndpoint(srv.URL), option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "other"})))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anonymous.Fetch(t.Context(), Ref{Store: "gcp", Name: "db"}); !errors.Is(err, ErrDenied) {
		t.Errorf("another token: %v, want refused", err)
	}
	if _, err := (&GCP{}).versionName("db"); err == nil || !strings.Contains(err.Error(), "names no project") {
		t.Errorf("a secret without a project: %v", err)
	}
}

package gitea

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestGiteaRedirectsAreRefused: a redirect from Gitea's URL is not
// followed, so neither the runner's token (in its headers) nor a
// registration token (in Register's body) reaches where it points.
func TestGiteaRedirectsAreRefused(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer other.Close()
	gitea := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer gitea.Close()
	hc, err := httpClient("")
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(hc, gitea.URL)
	if _, err := c.Register(t.Context(), "r", "registration-token", []string{"tofu"}); err == nil || !strings.Contains(err.Error(), "gitea redirected to "+other.URL) {
		t.Errorf("Register through a redirect: %v, want it refused naming where it pointed", err)
	}
	c.SetIdentity(Identity{UUID: "u", Token: "runner-token"})
	if err := c.Declare(t.Context(), []string{"tofu"}); err == nil || !strings.Contains(err.Error(), "the runner API has no redirects") {
		t.Errorf("Declare through a redirect: %v, want it refused", err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests, want none", n)
	}
}

package orchestrator_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
)

// client returns a Client of srv with auth.
func client(t *testing.T, srv *orchestratortest.Server, auth orchestrator.Authenticator) *orchestrator.Client {
	t.Helper()
	ca, err := srv.CAFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := orchestrator.NewClient(orchestrator.ClientOptions{URL: srv.URL(), DispatcherID: "d-1", Auth: auth, CAFile: ca})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func started(t *testing.T, opts orchestratortest.Options) *orchestratortest.Server {
	t.Helper()
	srv := orchestratortest.New(opts)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// roundTrip leases a task, renews it, reports its events and log, and
// checks what the orchestrator stored.
func roundTrip(t *testing.T, srv *orchestratortest.Server, c *orchestrator.Client) {
	t.Helper()
	ctx := context.Background()
	srv.Add(orchestrator.Task{ID: "t-1", Command: []string{"true"}})
	leases, err := c.Poll(ctx, 1, 4, nil, time.Second)
	if err != nil || len(leases) != 1 || leases[0].Task.ID != "t-1" || leases[0].Epoch != 1 {
		t.Fatalf("poll: %+v, %v", leases, err)
	}
	l := leases[0]
	if resp, err := c.Renew(ctx, l.LeaseID, l.Epoch); err != nil || resp.Cancel || !resp.ExpiresAt.After(time.Now()) {
		t.Fatalf("renew: %+v, %v", resp, err)
	}
	for _, e := range []orchestrator.Event{
		{IdempotencyKey: "t-1/job-created", Type: orchestrator.EventJobCreated, JobName: "rw-t-1"},
		{IdempotencyKey: "t-1/job-created", Type: orchestrator.EventJobCreated, JobName: "rw-t-1"},
		{IdempotencyKey: "t-1/final", Type: orchestrator.EventSucceeded, Reason: "Completed"},
	} {
		e.Epoch, e.Time = l.Epoch, time.Now()
		if err := c.Report(ctx, "t-1", e); err != nil {
			t.Fatalf("report %s: %v", e.Type, err)
		}
	}
	if err := c.Log(ctx, "t-1", orchestrator.LogChunk{IdempotencyKey: "t-1/log/0", Epoch: 1, Data: []byte("hello\n"), Final: true}); err != nil {
		t.Fatalf("log: %v", err)
	}
	rec := srv.Task("t-1")
	if rec.FinalStored != 1 || rec.Repeats != 1 || string(rec.Log) != "hello\n" || len(rec.Events) != 2 {
		t.Errorf("stored %+v", rec)
	}
	// The final event ended the lease.
	if _, err := c.Renew(ctx, l.LeaseID, l.Epoch); !orchestrator.IsGone(err) {
		t.Errorf("renew after the final event: %v, want 410", err)
	}
	// Nothing left: a poll waits and comes back empty.
	if leases, err := c.Poll(ctx, 1, 4, nil, time.Second); err != nil || len(leases) != 0 {
		t.Errorf("empty poll: %+v, %v", leases, err)
	}
}

func TestClientWithJWT(t *testing.T) {
	t.Parallel()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv := started(t, orchestratortest.Options{PublicKey: pub, MaxWait: time.Second})
	roundTrip(t, srv, client(t, srv, &orchestrator.JWT{Key: priv, KeyID: "k", Subject: "d-1", Audience: srv.URL()}))

	// Another key is refused, and that is fatal.
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	bad := client(t, srv, &orchestrator.JWT{Key: other, Subject: "d-1", Audience: srv.URL()})
	_, err = bad.Poll(context.Background(), 1, 1, nil, time.Second)
	if !orchestrator.IsFatal(err) || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong key: %v, want a fatal 401", err)
	}
}

func TestClientWithTokenFile(t *testing.T) {
	t.Parallel()
	srv := started(t, orchestratortest.Options{Token: "t0ken", DispatcherID: "d-1", MaxWait: time.Second})
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, srv, client(t, srv, &orchestrator.TokenFile{Path: p}))
}

func TestClientWithTokenExchange(t *testing.T) {
	t.Parallel()
	srv := started(t, orchestratortest.Options{ServiceAccountToken: "sa-token", DispatcherID: "d-1", ExchangeTTL: time.Hour, MaxWait: time.Second})
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte("sa-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, srv, client(t, srv, &orchestrator.Exchange{Path: p}))

	// A service account token the orchestrator does not accept is fatal.
	q := filepath.Join(t.TempDir(), "token")
	_ = os.WriteFile(q, []byte("someone-else"), 0o600)
	_, err := client(t, srv, &orchestrator.Exchange{Path: q}).Poll(context.Background(), 1, 1, nil, time.Second)
	if !orchestrator.IsFatal(err) || !strings.Contains(err.Error(), "token exchange") {
		t.Errorf("refused exchange: %v, want fatal", err)
	}
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	srv := started(t, orchestratortest.Options{MaxWait: time.Second, Faults: orchestratortest.Faults{ErrorBurst: 1, RetryAfter: 3 * time.Second}})
	c := client(t, srv, nil)
	ctx := context.Background()
	_, err := c.Poll(ctx, 1, 1, nil, time.Second)
	var e *orchestrator.Error
	if !orchestrator.IsRetryable(err) || !asError(err, &e) || e.Status != 503 || e.RetryAfter != 3*time.Second {
		t.Errorf("injected 503: %#v", err)
	}
	srv.SetFaults(orchestratortest.Faults{Unreachable: true})
	if _, err := c.Poll(ctx, 1, 1, nil, time.Second); !orchestrator.IsRetryable(err) || orchestrator.IsFatal(err) {
		t.Errorf("unreachable: %v, want retryable", err)
	}
	srv.SetFaults(orchestratortest.Faults{})
	srv.Add(orchestrator.Task{ID: "t-1"})
	leases, err := c.Poll(ctx, 1, 1, nil, time.Second)
	if err != nil || len(leases) != 1 {
		t.Fatal(leases, err)
	}
	// A report with a stale epoch is a conflict, not a retry.
	if _, err := c.Renew(ctx, leases[0].LeaseID, 1); err != nil {
		t.Fatal(err)
	}
	err = c.Report(ctx, "t-1", orchestrator.Event{IdempotencyKey: "t-1/running", Epoch: 0, Type: orchestrator.EventRunning, Time: time.Now()})
	if err == nil || orchestrator.IsRetryable(err) {
		t.Errorf("epoch 0: %v, want a refusal", err)
	}
	// A log chunk past the end is a conflict.
	err = c.Log(ctx, "t-1", orchestrator.LogChunk{IdempotencyKey: "t-1/log/10", Epoch: 1, Offset: 10, Data: []byte("x")})
	if !orchestrator.IsConflict(err) {
		t.Errorf("log gap: %v, want 409", err)
	}
}

func asError(err error, target **orchestrator.Error) bool { return errors.As(err, target) }

// A redirect is refused (the credentials would follow it), and a response
// over the size bound is an error that says so, not a truncated decode.
func TestClientRefusesRedirectsAndHugeResponses(t *testing.T) {
	t.Parallel()
	var followed atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/redirect/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, _ *http.Request) {
		followed.Store(true)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/huge/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"leases": [], "padding": "`))
		_, _ = w.Write(bytes.Repeat([]byte("x"), 9<<20))
		_, _ = w.Write([]byte(`"}`))
	})
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	for _, c := range []struct{ path, want string }{
		{"/redirect", "redirected"},
		{"/huge", "larger than 8 MiB"},
	} {
		cl, err := orchestrator.NewClient(orchestrator.ClientOptions{
			URL: srv.URL + c.path, DispatcherID: "d-1", Transport: srv.Client().Transport,
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.Poll(context.Background(), 1, 1, nil, time.Second)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.path, err, c.want)
		}
	}
	if followed.Load() {
		t.Error("the client followed the redirect")
	}
}

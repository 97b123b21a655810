package admission

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

func TestPooledServesOnWorkers(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := 0
	h := Pooled(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen++
		mu.Unlock()
		_, _ = w.Write([]byte(r.URL.Path))
	}), 2)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/r", nil))
			if rec.Code != http.StatusOK || rec.Body.String() != "/r" {
				t.Errorf("request %d: %d %q", i, rec.Code, rec.Body.String())
			}
		})
	}
	wg.Wait()
	if seen != 50 {
		t.Errorf("handler ran %d times, want 50", seen)
	}
}

func TestPooledGivesUpOnGoneClients(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	h := Pooled(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }), 1)
	defer close(release)
	busy := make(chan struct{})
	go func() {
		close(busy)
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", nil))
	}()
	<-busy
	time.Sleep(10 * time.Millisecond) // the only worker is now held
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("a request whose client left while waiting got %d, want 503", rec.Code)
	}
}

func TestPooledRecoversPanics(t *testing.T) {
	t.Parallel()
	h := Pooled(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/boom" {
			panic("boom")
		}
	}), 1)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/boom", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("a panicking handler answered %d, want 500", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/ok", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("after a panic the worker answered %d, want 200", rec.Code)
	}
}

package admission

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
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
	holding, release := make(chan struct{}), make(chan struct{})
	h := Pooled(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(holding)
		<-release
	}), 1)
	defer close(release)
	go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", nil))
	<-holding // the only worker is now held
	// The client is gone before its request can get a worker.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("a request whose client left while waiting got %d, want 503", rec.Code)
	}
}

func TestPooledRaisesPanicsOnTheServersGoroutine(t *testing.T) {
	t.Parallel()
	h := Pooled(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/boom" {
			panic("boom")
		}
	}), 1)
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("ServeHTTP raised %v, want the handler's panic", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/boom", nil))
	}()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/ok", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("after a panic the worker answered %d, want 200", rec.Code)
	}
}

// A client that goes away while its HTTP/1.1 request waits for a worker is
// noticed: its request never runs.
func TestPooledNoticesGoneHTTP1Clients(t *testing.T) {
	t.Parallel()
	held, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	ran := 0
	h := Pooled(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ran++
		mu.Unlock()
		if r.URL.Path == "/hold" {
			close(held)
			<-release
		}
	}), 1)
	goneArrived, goneServed := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/gone" {
			close(goneArrived)
		}
		h.ServeHTTP(w, r)
		if r.URL.Path == "/gone" {
			close(goneServed)
		}
	}))
	defer srv.Close()
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock() // before srv.Close, which waits for the held request
	holdDone := make(chan struct{})
	go func() {
		defer close(holdDone)
		if resp, err := http.Post(srv.URL+"/hold", "application/json", strings.NewReader("{}")); err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-held // the only worker is now busy
	// The client gives up once its request has reached the server.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	gone := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/gone", strings.NewReader(`{"a":1}`))
		if err == nil {
			var resp *http.Response
			if resp, err = http.DefaultClient.Do(req); err == nil {
				_ = resp.Body.Close()
			}
		}
		gone <- err
	}()
	select {
	case <-goneArrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the second request did not reach the server within 10 s")
	}
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("the second request: %v, want it given up, unanswered while the only worker was held", err)
	}
	select {
	case <-goneServed: // given up on, with the worker still held
	case <-time.After(10 * time.Second):
		t.Fatal("the request whose client left still waits for a worker")
	}
	unblock()
	<-holdDone
	mu.Lock()
	defer mu.Unlock()
	if ran != 1 {
		t.Errorf("the handler ran %d times, want 1 (the request whose client left must not run)", ran)
	}
}

// TestReadAllReadsTheBodyWhateverItClaims: the claimed size only sizes
// the first buffer; the bytes read are the body's, shorter, longer or
// without a claim, and the limit still cuts.
func TestReadAllReadsTheBodyWhateverItClaims(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("0123456789", 700) // 7,000 bytes
	for _, tt := range []struct {
		name  string
		in    string
		claim int64
		limit int64
		want  string
	}{
		{"as claimed", body, 7000, maxBody, body},
		{"no claim", body, -1, maxBody, body},
		{"shorter than claimed", body, 9000, maxBody, body},
		{"longer than claimed", body, 10, maxBody, body},
		{"a claim past the presized bound", body, maxPresized + 1, maxBody, body},
		{"cut by the limit", body, 7000, 100, body[:100]},
		{"empty", "", 0, maxBody, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// One byte per read, so the buffer fills and grows as a slow
			// client's would.
			got, err := readAll(io.LimitReader(iotest.OneByteReader(strings.NewReader(tt.in)), tt.limit), tt.claim)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("read %d bytes, want %d", len(got), len(tt.want))
			}
			if tt.claim > 0 && tt.claim <= maxPresized && int64(len(tt.want)) == tt.claim && cap(got) != int(tt.claim)+bytes.MinRead {
				t.Errorf("a body of the claimed size grew the buffer to %d", cap(got))
			}
		})
	}
	if _, err := readAll(iotest.ErrReader(errors.New("reset")), 100); err == nil || err.Error() != "reset" {
		t.Errorf("a failed read gave %v", err)
	}
}

// TestPooledBoundsTheBodyRead: a client that claims a body and never sends
// it is cut off at the read deadline; its request never runs.
func TestPooledBoundsTheBodyRead(t *testing.T) {
	t.Parallel()
	ran := make(chan struct{}, 1)
	srv := httptest.NewServer(pooledWith(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran <- struct{}{} }), 1, 200*time.Millisecond))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := fmt.Fprintf(conn, "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", maxPresized); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within 10 s to a body that never came: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
	select {
	case <-ran:
		t.Error("the request ran without its body")
	default:
	}
}

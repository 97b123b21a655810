package admission

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"time"
)

// maxBody is the most of a request body Pooled reads ahead: more than
// controller-runtime's own limit on an AdmissionReview (7 MiB), so that
// limit still decides.
const maxBody = 8 << 20

// Pooled serves requests on a fixed set of long-lived goroutines instead of
// the one the HTTP server starts for each request. Decoding an
// AdmissionReview and its pod recurses deeply enough that a fresh
// goroutine's stack is grown and copied on every request (12% of the
// webhook's CPU at saturation); a worker's stack stays grown. workers <= 0
// means four per CPU.
//
// The body is read before the request waits for a worker, so the server
// notices a client that goes away (HTTP/1.1 only watches the connection
// once the body is read); such a request is answered 503 without running.
// A panic in next is raised again on the server's goroutine, which handles
// it as for any handler.
func Pooled(next http.Handler, workers int) http.Handler {
	return pooledWith(next, workers, maxBodyRead)
}

// maxBodyRead bounds how long reading a body may take: the longest an API
// server waits for a webhook (timeoutSeconds is at most 30). A client that
// claims a body and sends it slowly, or never, holds its buffer no longer.
const maxBodyRead = 30 * time.Second

func pooledWith(next http.Handler, workers int, bodyRead time.Duration) http.Handler {
	if workers <= 0 {
		workers = 4 * runtime.GOMAXPROCS(0)
	}
	p := &pool{next: next, work: make(chan *pooled), bodyRead: bodyRead}
	for range workers {
		go p.serve()
	}
	return p
}

type pool struct {
	next     http.Handler
	work     chan *pooled
	bodyRead time.Duration
}

type pooled struct {
	w     http.ResponseWriter
	r     *http.Request
	done  chan struct{}
	panic any
}

func (p *pool) serve() {
	for q := range p.work {
		p.handle(q)
	}
}

// handle serves one request; a panic is handed back to ServeHTTP and the
// worker lives on.
func (p *pool) handle(q *pooled) {
	defer close(q.done)
	defer func() { q.panic = recover() }()
	p.next.ServeHTTP(q.w, q.r)
}

func (p *pool) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		// Not every writer has deadlines (a test's recorder): then the
		// read is bounded by the client alone, as before. The deadline is
		// lifted once the body is in, so a kept-alive connection's next
		// request is not cut by it; after a failed read it stays, and
		// the server gives up on the rest of the body at once.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(p.bodyRead))
		body, err := readAll(io.LimitReader(r.Body, maxBody), r.ContentLength)
		if err != nil {
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		_ = rc.SetReadDeadline(time.Time{})
		_ = r.Body.Close()
		r.Body = &readBody{Reader: bytes.NewReader(body), body: body}
	}
	q := &pooled{w: w, r: r, done: make(chan struct{})}
	select {
	case p.work <- q:
	case <-r.Context().Done():
		http.Error(w, "the client went away while the request waited", http.StatusServiceUnavailable)
		return
	}
	<-q.done
	if q.panic != nil {
		panic(q.panic)
	}
}

// maxPresized bounds the buffer readAll makes from a request's
// Content-Length before any of the body has arrived, so that a client
// claiming a large body it never sends holds no more than this.
const maxPresized = 64 << 10

// readAll is io.ReadAll(r) into a buffer of the size the request claims
// (size, its Content-Length; up to maxPresized), which an AdmissionReview
// fills in one allocation where io.ReadAll's doubling makes several. A
// body longer than claimed still reads whole (the limit is r's).
func readAll(r io.Reader, size int64) ([]byte, error) {
	if size <= 0 || size > maxPresized {
		return io.ReadAll(r)
	}
	// ReadFrom grows a buffer with less than MinRead free before each
	// read: with that much over the claim, a body of the claimed size
	// reaches EOF in the first buffer.
	buf := bytes.NewBuffer(make([]byte, 0, int(size)+bytes.MinRead))
	_, err := buf.ReadFrom(r)
	return buf.Bytes(), err
}

// readBody is a request body Pooled has read ahead: the handler may take
// its bytes (readAhead) instead of reading them into a copy.
type readBody struct {
	*bytes.Reader
	body []byte
}

func (*readBody) Close() error { return nil }

// readAhead is the whole body of r if Pooled read it ahead and nothing
// has read from it since; r.Body is left as it is.
func readAhead(r *http.Request) ([]byte, bool) {
	b, ok := r.Body.(*readBody)
	if !ok || b.Len() != len(b.body) {
		return nil, false
	}
	return b.body, true
}

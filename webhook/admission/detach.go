package admission

import (
	"context"
	"net/http"
	"time"
)

// Timeouts of a request: the API server sends its webhook's timeoutSeconds
// as the `timeout` parameter; without it, Kubernetes' default applies, and
// no webhook may wait longer than the maximum.
const (
	defaultTimeout = 10 * time.Second
	maxTimeout     = 30 * time.Second
)

// Detached serves each request with a context of its own, so that a server
// shutting down finishes the requests in flight instead of cancelling them.
// controller-runtime's webhook server derives request contexts from its own
// and cancels that before it drains: a request waiting for a worker was
// answered 503, and an evaluation or a namespace read in progress failed.
//
// The request's context ends at its own timeout (the `timeout` parameter,
// default 10 s, at most 30 s) or when its client goes away, as before; once
// stopping is closed, a cancellation that reaches the request through the
// server is the server's, not its client's, and is ignored. Close stopping
// before the server's context is cancelled.
func Detached(next http.Handler, stopping <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), requestTimeout(r))
		defer cancel()
		stop := context.AfterFunc(r.Context(), func() {
			select {
			case <-stopping:
			default:
				cancel()
			}
		})
		defer stop()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// requestTimeout is the request's `timeout` parameter, within bounds.
func requestTimeout(r *http.Request) time.Duration {
	d, err := time.ParseDuration(r.URL.Query().Get("timeout"))
	switch {
	case err != nil || d <= 0:
		return defaultTimeout
	case d > maxTimeout:
		return maxTimeout
	}
	return d
}

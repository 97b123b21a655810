package orchestrator

import (
	"context"
	"net/http"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A Job whose reconciles fail again and again (a report the orchestrator
// does not take) is retried at the pace of the source's Backoff, never
// later than its Max, Retry-After included; controller-runtime's default
// would wait 5 ms doubled per failure, up to 1000 s. A reconcile that goes
// through starts the count again.
func TestReconcileRetriesFollowTheBackoff(t *testing.T) {
	t.Parallel()
	const base, maxDelay = 100 * time.Millisecond, 2 * time.Second
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "runners", Name: "rw-t-1"}}
	tests := []struct {
		name     string
		failures int
		err      error
		// The last wait is within [least, most]; every wait is at most
		// maxDelay.
		least, most time.Duration
	}{
		{name: "the first retry comes within the base", failures: 1, err: &Error{Status: http.StatusServiceUnavailable}, most: base},
		{name: "forty failures in a row wait no longer than the cap", failures: 40, err: &Error{Status: http.StatusServiceUnavailable}, most: maxDelay},
		{name: "Retry-After is honoured up to the cap", failures: 1, err: &Error{Status: http.StatusServiceUnavailable, RetryAfter: time.Minute}, least: maxDelay, most: maxDelay},
		{name: "Retry-After within the cap is honoured", failures: 1, err: &Error{Status: http.StatusTooManyRequests, RetryAfter: time.Second}, least: time.Second, most: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Every reconcile fails, with tt.err, at its first read.
			kube := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
				Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
					return tt.err
				},
			}).Build()
			s := New(Options{Kube: kube, Namespace: "runners", Backoff: Backoff{Base: base, Max: maxDelay}})
			limiter := s.controllerOptions().RateLimiter
			var last time.Duration
			for i := range tt.failures {
				if _, err := s.Reconcile(t.Context(), req); err == nil {
					t.Fatal("reconcile went through; want it to fail")
				}
				last = limiter.When(req)
				if last > maxDelay {
					t.Fatalf("retry %d waits %s, more than the cap %s", i+1, last, maxDelay)
				}
			}
			if last < tt.least || last > tt.most {
				t.Errorf("after %d failures the retry waits %s, want within [%s, %s]", tt.failures, last, tt.least, tt.most)
			}
			if n := limiter.NumRequeues(req); n != tt.failures {
				t.Errorf("%d requeues counted, want %d", n, tt.failures)
			}
			limiter.Forget(req)
			if n, d := limiter.NumRequeues(req), limiter.When(req); n != 0 || d > base {
				t.Errorf("after a reconcile that went through: %d requeues counted, next wait %s; want 0 and at most %s", n, d, base)
			}
		})
	}
}

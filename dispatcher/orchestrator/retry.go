package orchestrator

import (
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// retryLimiter paces the Job controller's retries of a Job whose reconcile
// failed (a report the orchestrator did not take, a write of the Job) with
// the source's Backoff, as polls and renewals are paced: Base doubling to
// Max (--retry-max-delay) with full jitter, a Retry-After honoured up to
// Max. controller-runtime's default, 5 ms doubling to 1000 s per Job, has a
// Job whose reconciles failed a dozen times in a row (an outage of the
// orchestrator, a closed fence) wait minutes after the cause is gone.
type retryLimiter struct {
	backoff Backoff
	mu      sync.Mutex
	// failures counts each Job's failed reconciles since its last one that
	// went through; errs holds the last error, for its Retry-After.
	failures map[reconcile.Request]int
	errs     map[reconcile.Request]error
}

var _ workqueue.TypedRateLimiter[reconcile.Request] = (*retryLimiter)(nil)

func newRetryLimiter(b Backoff) *retryLimiter {
	return &retryLimiter{backoff: b, failures: map[reconcile.Request]int{}, errs: map[reconcile.Request]error{}}
}

// failed records the error a reconcile of req returned; the controller
// asks When next.
func (l *retryLimiter) failed(req reconcile.Request, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs[req] = err
}

// When is the wait before req is reconciled again after a failure.
func (l *retryLimiter) When(req reconcile.Request) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.failures[req]
	l.failures[req] = n + 1
	return l.backoff.Delay(n, l.errs[req])
}

// Forget starts req's count again: a reconcile of it went through.
func (l *retryLimiter) Forget(req reconcile.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.failures, req)
	delete(l.errs, req)
}

// NumRequeues is how many times req was retried after a failure.
func (l *retryLimiter) NumRequeues(req reconcile.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failures[req]
}

package kube

import (
	"sync"

	toolscache "k8s.io/client-go/tools/cache"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
)

// waitingCount counts, in each namespace, the cached RunnerTasks that may
// wait for a slot (mayWait), from the cache's own events. It bounds the
// waiting line without reading it: while the running tasks and that count
// fit in the slots, every waiting task fits, the order does not matter,
// and a start need not read and order the line (at 1,000 waiting tasks,
// a read of 1,000 objects for every start).
type waitingCount struct {
	mu sync.Mutex
	n  map[string]int
	// synced tells that the count has seen every task the cache listed
	// when it started; until then it is not used.
	synced func() bool
}

func newWaitingCount() *waitingCount {
	return &waitingCount{n: map[string]int{}}
}

// atMost is the count for a namespace, and false until it has seen every
// task the cache listed first (or when no cache feeds it).
func (w *waitingCount) atMost(namespace string) (int, bool) {
	if w.synced == nil || !w.synced() {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[namespace], true
}

func (w *waitingCount) add(obj any, d int) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	t, ok := obj.(*v1alpha1.RunnerTask)
	if !ok || mayWait(t) == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n[t.Namespace] += d
	if w.n[t.Namespace] <= 0 {
		delete(w.n, t.Namespace)
	}
}

// handler keeps the count from the RunnerTask informer's events.
func (w *waitingCount) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { w.add(obj, 1) },
		UpdateFunc: func(old, obj any) {
			w.add(old, -1)
			w.add(obj, 1)
		},
		DeleteFunc: func(obj any) { w.add(obj, -1) },
	}
}

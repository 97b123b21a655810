package kube

import (
	"iter"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	// tasks holds, by namespace, the tasks that may wait.
	tasks map[string]map[types.NamespacedName]struct{}
	// synced tells that the count has seen every task the cache listed
	// when it started; until then it is not used.
	synced func() bool
}

func newWaitingCount() *waitingCount {
	return &waitingCount{tasks: map[string]map[types.NamespacedName]struct{}{}}
}

// atMost bounds the waiting line of a namespace: the tasks that may wait,
// less those of them being started (starting: the tasks of the
// reservations, a task maybe more than once), which the line leaves out
// and the running count already holds. False until the count has seen
// every task the cache listed first (or when no cache feeds it).
func (w *waitingCount) atMost(namespace string, starting iter.Seq[types.NamespacedName]) (int, bool) {
	if w.synced == nil || !w.synced() {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.tasks[namespace]
	seen := map[types.NamespacedName]bool{}
	for t := range starting {
		if _, ok := set[t]; ok {
			seen[t] = true
		}
	}
	return len(set) - len(seen), true
}

func (w *waitingCount) add(obj any, in bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	t, ok := obj.(*v1alpha1.RunnerTask)
	if !ok || (in && mayWait(t) == nil) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.tasks[t.Namespace]
	if !in {
		delete(set, client.ObjectKeyFromObject(t))
		if len(set) == 0 {
			delete(w.tasks, t.Namespace)
		}
		return
	}
	if set == nil {
		set = map[types.NamespacedName]struct{}{}
		w.tasks[t.Namespace] = set
	}
	set[client.ObjectKeyFromObject(t)] = struct{}{}
}

// handler keeps the count from the RunnerTask informer's events.
func (w *waitingCount) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { w.add(obj, true) },
		UpdateFunc: func(_, obj any) {
			w.add(obj, false)
			w.add(obj, true)
		},
		DeleteFunc: func(obj any) { w.add(obj, false) },
	}
}

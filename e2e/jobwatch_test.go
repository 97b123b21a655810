//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/e2e/harness"
	"github.com/runwarden/runwarden/internal/contract"
)

// maxViolations bounds the violations a jobWatch keeps in full; the rest
// are counted.
const maxViolations = 20

// jobWatch watches the Jobs and pods of a namespace for a whole run and
// checks two rules on every event it receives, in the order the API server
// gave them:
//
//   - no more than maxConcurrent Jobs of one dispatcher (label
//     runwarden.dev/dispatcher) hold a slot at once. A Job holds its slot
//     while it exists and can still run: until it finishes (job.Finished),
//     or is suspended with its outcome recorded on it (the orchestrator
//     source's stop), or is gone from the API server. A Job with a
//     deletionTimestamp still exists (a foreground deletion keeps it until
//     its pods are gone, and they may run meanwhile), so it counts. That is
//     the dispatcher's rule (docs/dispatcher.md: a slot is free only once
//     its Job can no longer run, and capacity counts every unfinished Job
//     the dispatcher owns). The preflight's Jobs are no task's and take no
//     task's slot: they are not counted;
//   - no task (label runwarden.dev/task-id) ever has pods of two different
//     Jobs (the pods' controller reference), across the whole run.
//
// It uses informers: a watch that ends is resumed from the last resource
// version seen, and one that cannot be (410 Gone) lists again; the list is
// compared with what was seen, so an object changed or deleted meanwhile
// still reaches the handlers (a deletion as a tombstone). Only states that
// came and went entirely within such a gap are not seen; the restarts are
// counted and reported.
type jobWatch struct {
	maxConcurrent int
	cancel        context.CancelFunc
	done          chan struct{}
	jobInformer   cache.SharedIndexInformer
	podInformer   cache.SharedIndexInformer

	mu sync.Mutex
	// jobs and pods are the objects as the handlers last saw them; they
	// lag the informers' stores only by the events not handled yet.
	jobs map[types.UID]*batchv1.Job
	pods map[types.UID]string // resource version
	// taskJob is the first Job whose pod each task was seen with.
	taskJob map[string]podJob
	// events counts the events handled, by kind and type; restarts the
	// watches that ended with an error.
	events   map[string]int
	restarts int
	// most is the most Jobs holding a slot at once, per dispatcher.
	most       map[string]int
	violations []string
	dropped    int
	stopped    bool
}

// podJob is the Job a task's pod belonged to.
type podJob struct {
	job string
	uid types.UID
	pod string
}

// watchJobs starts a jobWatch of namespace ns and returns once it has
// listed what is there; call it before the first task. Its check, at the
// end of the run, stops it and reports what it found.
func watchJobs(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, maxConcurrent int) *jobWatch {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		t.Fatalf("a client for the Job watch: %v", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &jobWatch{
		maxConcurrent: maxConcurrent, cancel: cancel, done: make(chan struct{}),
		jobs: map[types.UID]*batchv1.Job{}, pods: map[types.UID]string{}, taskJob: map[string]podJob{},
		events: map[string]int{}, most: map[string]int{},
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	w.jobInformer = factory.Batch().V1().Jobs().Informer()
	w.podInformer = factory.Core().V1().Pods().Informer()
	for _, inf := range []cache.SharedIndexInformer{w.jobInformer, w.podInformer} {
		if err := inf.SetWatchErrorHandlerWithContext(w.watchEnded); err != nil {
			t.Fatalf("the Job watch: %v", err)
		}
	}
	for inf, handle := range map[cache.SharedIndexInformer]func(string, any){w.jobInformer: w.jobEvent, w.podInformer: w.podEvent} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { handle("added", o) },
			UpdateFunc: func(_, o any) { handle("modified", o) },
			DeleteFunc: func(o any) { handle("deleted", o) },
		}); err != nil {
			t.Fatalf("the Job watch: %v", err)
		}
	}
	go func() {
		defer close(w.done)
		factory.Start(ctx.Done())
		<-ctx.Done()
		factory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), w.jobInformer.HasSynced, w.podInformer.HasSynced) {
		cancel()
		t.Fatalf("the Job and pod watches of %s did not start: %v", ns, ctx.Err())
	}
	t.Cleanup(w.stop)
	return w
}

// watchEnded counts a watch that ended with an error; the reflector then
// resumes or lists again.
func (w *jobWatch) watchEnded(ctx context.Context, r *cache.Reflector, err error) {
	cache.DefaultWatchErrorHandler(ctx, r, err)
	w.mu.Lock()
	w.restarts++
	w.mu.Unlock()
}

// holdsSlot tells whether a Job of a dispatcher holds one of its slots
// (see jobWatch).
func holdsSlot(j *batchv1.Job) bool {
	switch {
	case j.Labels[contract.LabelDispatcher] == "" || j.Annotations[job.AnnotationPreflight] != "":
		return false
	case job.Finished(j):
		return false
	case ptr.Deref(j.Spec.Suspend, false) && j.Annotations[orchestrator.AnnotationOutcome] != "":
		return false
	}
	return true
}

// tombstone unwraps a deletion the informer inferred from a new list.
func tombstone(o any) any {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return o
}

// note keeps what an event says of an object, by its UID: v, or nothing
// once it is deleted.
func note[T any](m map[types.UID]T, typ string, uid types.UID, v T) {
	if typ == "deleted" {
		delete(m, uid)
		return
	}
	m[uid] = v
}

func (w *jobWatch) jobEvent(typ string, o any) {
	j, ok := tombstone(o).(*batchv1.Job)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.events["Job "+typ]++
	note(w.jobs, typ, j.UID, j)
	id := j.Labels[contract.LabelDispatcher]
	if id == "" {
		return
	}
	var holding []string
	for _, o := range w.jobs {
		if o.Labels[contract.LabelDispatcher] == id && holdsSlot(o) {
			holding = append(holding, describeJob(o))
		}
	}
	w.most[id] = max(w.most[id], len(holding))
	if len(holding) > w.maxConcurrent {
		slices.Sort(holding)
		w.violate(fmt.Sprintf("after Job %s %s (resourceVersion %s, task %s): %d Jobs of dispatcher %s hold a slot, --max-concurrent %d:\n\t%s",
			j.Name, typ, j.ResourceVersion, j.Annotations[job.AnnotationTaskID], len(holding), id, w.maxConcurrent, strings.Join(holding, "\n\t")))
	}
}

// describeJob is what a violation says of a Job holding a slot.
func describeJob(j *batchv1.Job) string {
	var conds []string
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			conds = append(conds, string(c.Type))
		}
	}
	s := fmt.Sprintf("%s (uid %s, task %s, created %s, active %d, suspended %v, conditions %v",
		j.Name, j.UID, j.Annotations[job.AnnotationTaskID], j.CreationTimestamp.Format(time.RFC3339), j.Status.Active, ptr.Deref(j.Spec.Suspend, false), conds)
	if j.DeletionTimestamp != nil {
		s += ", deleting since " + j.DeletionTimestamp.Format(time.RFC3339)
	}
	if j.Annotations[job.AnnotationAwaitingSecret] != "" {
		s += ", awaiting its Secret"
	}
	return s + ")"
}

func (w *jobWatch) podEvent(typ string, o any) {
	p, ok := tombstone(o).(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.events["Pod "+typ]++
	note(w.pods, typ, p.UID, p.ResourceVersion)
	task := p.Labels[contract.LabelTaskID]
	owner := metav1.GetControllerOf(p)
	if task == "" || owner == nil || owner.Kind != "Job" {
		return
	}
	first, seen := w.taskJob[task]
	switch {
	case !seen:
		w.taskJob[task] = podJob{job: owner.Name, uid: owner.UID, pod: p.Name}
	case first.uid != owner.UID:
		w.violate(fmt.Sprintf("task %s (%s) has pods of two Jobs: pod %s of Job %s (uid %s) %s (resourceVersion %s, phase %s, node %q), after pod %s of Job %s (uid %s)",
			task, p.Annotations[job.AnnotationTaskID], p.Name, owner.Name, owner.UID, typ, p.ResourceVersion, p.Status.Phase, p.Spec.NodeName, first.pod, first.job, first.uid))
	}
}

// violate records a violation; w.mu is held.
func (w *jobWatch) violate(v string) {
	if len(w.violations) < maxViolations {
		w.violations = append(w.violations, v)
		return
	}
	w.dropped++
}

// caughtUp tells whether the handlers have seen every object in the
// informers' stores at its stored version.
func (w *jobWatch) caughtUp() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	jobs, pods := w.jobInformer.GetStore().List(), w.podInformer.GetStore().List()
	if len(jobs) != len(w.jobs) || len(pods) != len(w.pods) {
		return false
	}
	for _, o := range jobs {
		j := o.(*batchv1.Job)
		if seen := w.jobs[j.UID]; seen == nil || seen.ResourceVersion != j.ResourceVersion {
			return false
		}
	}
	for _, o := range pods {
		p := o.(*corev1.Pod)
		if w.pods[p.UID] != p.ResourceVersion {
			return false
		}
	}
	return true
}

// stop ends the watches; the handlers take no event after it.
func (w *jobWatch) stop() {
	w.cancel()
	<-w.done
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

// check waits for the handlers to catch up with the watches, stops them,
// fails t with every violation seen, and logs what was watched: the most
// Jobs of one dispatcher that held a slot at once, and the events.
func (w *jobWatch) check(ctx context.Context, t *testing.T) {
	t.Helper()
	caught := func(context.Context) (bool, error) { return w.caughtUp(), nil }
	if err := harness.WaitFor(ctx, "the Job watch to handle every event", 30*time.Second, caught); err != nil {
		t.Errorf("%v: the last events were not checked", err)
	}
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.violations {
		t.Errorf("the Job watch saw: %s", v)
	}
	if w.dropped > 0 {
		t.Errorf("the Job watch saw %d more violations", w.dropped)
	}
	most := 0
	for _, n := range w.most {
		most = max(most, n)
	}
	var counts []string
	for _, k := range slices.Sorted(maps.Keys(w.events)) {
		counts = append(counts, fmt.Sprintf("%s %d", k, w.events[k]))
	}
	t.Logf("the Job watch: at most %d Jobs of one dispatcher held a slot at once (--max-concurrent %d), per dispatcher %v; %d tasks had pods; events: %s; %d watches restarted",
		most, w.maxConcurrent, w.most, len(w.taskJob), strings.Join(counts, ", "), w.restarts)
}

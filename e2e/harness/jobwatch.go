package harness

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
	"github.com/runwarden/runwarden/internal/contract"
)

// maxViolations bounds the violations a JobWatch keeps in full; the rest
// are counted.
const maxViolations = 20

// JobWatch watches the Jobs and pods of a namespace for a whole run and
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
type JobWatch struct {
	maxConcurrent int
	client        kubernetes.Interface
	namespace     string
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

// WatchJobs starts a JobWatch of namespace ns and returns once it has
// listed what is there; call it before the first task. Its Check, at the
// end of the run, stops it and reports what it found.
func WatchJobs(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, maxConcurrent int) *JobWatch {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		t.Fatalf("a client for the Job watch: %v", err)
	}
	return watchJobs(ctx, t, cs, ns, maxConcurrent)
}

// watchJobs is WatchJobs through cs.
func watchJobs(ctx context.Context, t testing.TB, cs kubernetes.Interface, ns string, maxConcurrent int) *JobWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	w := &JobWatch{
		maxConcurrent: maxConcurrent, client: cs, namespace: ns, cancel: cancel, done: make(chan struct{}),
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
	for _, inf := range []cache.SharedIndexInformer{w.jobInformer, w.podInformer} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { w.event("added", o) },
			UpdateFunc: func(_, o any) { w.event("modified", o) },
			DeleteFunc: func(o any) { w.event("deleted", o) },
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
func (w *JobWatch) watchEnded(ctx context.Context, r *cache.Reflector, err error) {
	cache.DefaultWatchErrorHandler(ctx, r, err)
	w.mu.Lock()
	w.restarts++
	w.mu.Unlock()
}

// holdsSlot tells whether a Job of a dispatcher holds one of its slots
// (see JobWatch).
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

// event handles one event of either watch.
func (w *JobWatch) event(typ string, o any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	switch o := tombstone(o).(type) {
	case *batchv1.Job:
		w.events["Job "+typ]++
		note(w.jobs, typ, o.UID, o)
		w.checkSlots(typ, o)
	case *corev1.Pod:
		w.events["Pod "+typ]++
		note(w.pods, typ, o.UID, o.ResourceVersion)
		w.checkPod(typ, o)
	}
}

// checkSlots checks, after an event of Job j, that no more than
// maxConcurrent Jobs of its dispatcher hold a slot. w.mu is held.
func (w *JobWatch) checkSlots(typ string, j *batchv1.Job) {
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
			j.Name, typ, j.ResourceVersion, j.Annotations[contract.TaskID], len(holding), id, w.maxConcurrent, strings.Join(holding, "\n\t")))
	}
}

// describeJob is what a violation or a dump says of a Job, in a line.
func describeJob(j *batchv1.Job) string {
	var conds []string
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			conds = append(conds, string(c.Type))
		}
	}
	s := fmt.Sprintf("%s (uid %s, task %s, created %s, active %d, succeeded %d, failed %d, suspended %v, conditions %v",
		j.Name, j.UID, j.Annotations[contract.TaskID], j.CreationTimestamp.Format(time.RFC3339), j.Status.Active, j.Status.Succeeded, j.Status.Failed, ptr.Deref(j.Spec.Suspend, false), conds)
	if j.DeletionTimestamp != nil {
		s += ", deleting since " + j.DeletionTimestamp.Format(time.RFC3339)
	}
	if j.Annotations[job.AnnotationAwaitingSecret] != "" {
		s += ", awaiting its Secret"
	}
	if j.Annotations[job.AnnotationReported] == "true" {
		s += ", reported"
	}
	return s + ")"
}

// checkPod checks, after an event of pod p, that its task has pods of no
// other Job. w.mu is held.
func (w *JobWatch) checkPod(typ string, p *corev1.Pod) {
	task := p.Labels[contract.TaskID]
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
			task, p.Annotations[contract.TaskID], p.Name, owner.Name, owner.UID, typ, p.ResourceVersion, p.Status.Phase, p.Spec.NodeName, first.pod, first.job, first.uid))
	}
}

// violate records a violation; w.mu is held.
func (w *JobWatch) violate(v string) {
	if len(w.violations) < maxViolations {
		w.violations = append(w.violations, v)
		return
	}
	w.dropped++
}

// caughtUp tells whether the handlers have seen every Job and pod of the
// namespace as the API server lists them now, at its listed version.
func (w *JobWatch) caughtUp(ctx context.Context) (bool, error) {
	jobs, err := w.client.BatchV1().Jobs(w.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, nil // listed again until the deadline
	}
	pods, err := w.client.CoreV1().Pods(w.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(jobs.Items) != len(w.jobs) || len(pods.Items) != len(w.pods) {
		return false, nil
	}
	for _, j := range jobs.Items {
		if seen := w.jobs[j.UID]; seen == nil || seen.ResourceVersion != j.ResourceVersion {
			return false, nil
		}
	}
	for _, p := range pods.Items {
		if rv, ok := w.pods[p.UID]; !ok || rv != p.ResourceVersion {
			return false, nil
		}
	}
	return true, nil
}

// stop ends the watches; the handlers take no event after it.
func (w *JobWatch) stop() {
	w.cancel()
	<-w.done
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

// JobWatchReport is what a JobWatch saw.
type JobWatchReport struct {
	// Most is the most Jobs that held a slot at once, per dispatcher.
	Most map[string]int
	// Events counts the events handled, by kind and type ("Job added").
	Events map[string]int
	// Tasks is how many tasks had pods.
	Tasks int
	// Restarts counts the watches that ended with an error.
	Restarts int
	// Violations are the first violations in full; Dropped counts the
	// rest.
	Violations []string
	Dropped    int
	// Missed says the handlers did not catch up with the watches before
	// the end: the last events were not checked.
	Missed error
}

// Stop waits for the handlers to catch up with the watches, stops them, and
// returns what they saw.
func (w *JobWatch) Stop(ctx context.Context) JobWatchReport {
	missed := WaitFor(ctx, "the Job watch to handle every event up to a list of now", 30*time.Second, w.caughtUp)
	w.stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	return JobWatchReport{
		Most: maps.Clone(w.most), Events: maps.Clone(w.events), Tasks: len(w.taskJob), Restarts: w.restarts,
		Violations: slices.Clone(w.violations), Dropped: w.dropped, Missed: missed,
	}
}

// Check stops the watch (Stop), fails t with every violation seen, and logs
// what was watched: the most Jobs of one dispatcher that held a slot at
// once, and the events.
func (w *JobWatch) Check(ctx context.Context, t *testing.T) {
	t.Helper()
	r := w.Stop(ctx)
	if r.Missed != nil {
		t.Errorf("%v: the last events were not checked", r.Missed)
	}
	for _, v := range r.Violations {
		t.Errorf("the Job watch saw: %s", v)
	}
	if r.Dropped > 0 {
		t.Errorf("the Job watch saw %d more violations", r.Dropped)
	}
	most := 0
	for _, n := range r.Most {
		most = max(most, n)
	}
	var counts []string
	for _, k := range slices.Sorted(maps.Keys(r.Events)) {
		counts = append(counts, fmt.Sprintf("%s %d", k, r.Events[k]))
	}
	t.Logf("the Job watch: at most %d Jobs of one dispatcher held a slot at once (--max-concurrent %d), per dispatcher %v; %d tasks had pods; events: %s; %d watches restarted",
		most, w.maxConcurrent, r.Most, r.Tasks, strings.Join(counts, ", "), r.Restarts)
}

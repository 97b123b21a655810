//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/kube"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/e2e/harness"
	"github.com/runwarden/runwarden/internal/contract"
)

// kueueNamespaceLabel marks the namespaces of the tests that use Kueue.
// The suite's Kueue (hack/kueue.sh up --namespace-label) manages, and its
// Job webhooks see, the Jobs of those namespaces only, so that the tests
// beside the Kueue tests never meet it.
const kueueNamespaceLabel = "runwarden.dev/e2e-kueue"

// sharedKueue is the one Kueue of the suite's cluster: the first test that
// needs it starts it, the last one done with it stops it.
type sharedKueue struct {
	mu    sync.Mutex
	users int
}

// suiteKueue is the suite's Kueue; tests that use it run side by side.
var suiteKueue sharedKueue

// run runs hack/kueue.sh verb for the suite's cluster.
func (k *sharedKueue) run(ctx context.Context, verb string) error {
	args := []string{verb, "--name", suite.Name}
	if verb == "up" {
		args = append(args, "--namespace-label", kueueNamespaceLabel+"=true")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(suite.RepoRoot, "hack", "kueue.sh"), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/kueue.sh %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (k *sharedKueue) acquire(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.users == 0 {
		if err := k.run(ctx, "up"); err != nil {
			return err
		}
	}
	k.users++
	return nil
}

func (k *sharedKueue) release() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.users--
	if k.users > 0 {
		return nil
	}
	return k.run(context.Background(), "down")
}

// kueueUp has the suite's Kueue running beside the local cluster
// (hack/kueue.sh) until t ends. Kueue is real: its controller manager, its
// CRDs and its webhooks, built pinned by hack/tools.sh. Each namespace that
// Kueue is to act in is then labelled with kueueNamespace.
func kueueUp(ctx context.Context, t testing.TB) {
	t.Helper()
	if suite.Kind != harness.ClusterLocal {
		t.Skipf("skipped: Kueue runs beside the local cluster only (hack/kueue.sh); this run uses a %s cluster", suite.Kind)
	}
	if err := suiteKueue.acquire(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := suiteKueue.release(); err != nil {
			t.Error(err)
		}
	})
}

// kueueNamespace labels the namespace of ctx (harness.Namespace) for the
// suite's Kueue, and waits until both its webhooks (in the API server) and
// its controller act there: a Job naming a LocalQueue comes back from a dry
// run suspended by Kueue's webhook, and Kueue makes a Workload for a real
// one, which is deleted again, Workload and all, before it returns.
func kueueNamespace(ctx context.Context, t testing.TB, cfg *envconf.Config) {
	t.Helper()
	ns := harness.Namespace(ctx)
	if err := harness.LabelNamespace(ctx, cfg, kueueNamespaceLabel, "true"); err != nil {
		t.Fatal(err)
	}
	c := cfg.Client().Resources().GetControllerRuntimeClient()
	probe := func() *batchv1.Job {
		return &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "kueue-probe", Namespace: ns, Labels: map[string]string{job.LabelQueueName: "kueue-probe"}},
			Spec: batchv1.JobSpec{Suspend: ptr.To(false), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				// No node has it: were Kueue to miss the Job, no pod of it runs.
				NodeSelector: map[string]string{kueueNamespaceLabel + "-probe": "no-node"},
				Containers:   []corev1.Container{{Name: "main", Image: "busybox:stable"}},
			}}},
		}
	}
	suspended := func(ctx context.Context) (bool, error) {
		p := probe()
		if err := c.Create(ctx, p, client.DryRunAll); err != nil {
			return false, fmt.Errorf("a dry run of a Job naming a LocalQueue in %s: %w", ns, err)
		}
		return ptr.Deref(p.Spec.Suspend, false), nil
	}
	if err := harness.WaitFor(ctx, "Kueue's webhooks to see namespace "+ns, time.Minute, suspended); err != nil {
		t.Fatal(err)
	}
	p := probe()
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	if !ptr.Deref(p.Spec.Suspend, false) {
		t.Fatalf("Kueue's webhooks left Job %s/%s unsuspended, after suspending it in a dry run", ns, p.Name)
	}
	workloads := func(ctx context.Context) (int, error) {
		var list unstructured.UnstructuredList
		list.SetAPIVersion("kueue.x-k8s.io/v1beta2")
		list.SetKind("WorkloadList")
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return 0, err
		}
		return len(list.Items), nil
	}
	pokes := 0
	made := func(ctx context.Context) (bool, error) {
		if n, err := workloads(ctx); err != nil || n > 0 {
			return n > 0, nil
		}
		// Kueue's controller may have read the Job before it saw the
		// label, and then left it: a change has it read the Job again.
		pokes++
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.runwarden.dev/kueue-probe":"%d"}}}`, pokes)
		return false, c.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(patch)))
	}
	if err := harness.WaitFor(ctx, "Kueue to make a Workload for a Job in "+ns, time.Minute, made); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, p, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	gone := func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(p), &batchv1.Job{})
		if !apierrors.IsNotFound(err) {
			return false, nil
		}
		n, err := workloads(ctx)
		return err == nil && n == 0, nil
	}
	if err := harness.WaitFor(ctx, "the probe Job and its Workload to be deleted from "+ns, time.Minute, gone); err != nil {
		t.Fatal(err)
	}
}

// applyObjects creates the objects of a YAML stream and deletes them when
// the test ends.
func applyObjects(ctx context.Context, t testing.TB, cfg *envconf.Config, docs string) {
	t.Helper()
	for _, doc := range strings.Split(docs, "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if obj.GetKind() == "" {
			continue
		}
		if err := cfg.Client().Resources().Create(ctx, obj); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), obj) })
	}
}

// clusterQueue is a ResourceFlavor-backed ClusterQueue of name with a quota
// of pods, in cohort (if any), preempting lower priorities within it if
// preempt, and a LocalQueue of the same name in ns pointing at it.
func clusterQueue(ns, name, flavor, cohort string, pods int, preempt bool) string {
	policy := "Never"
	if preempt {
		policy = "LowerPriority"
	}
	c := ""
	if cohort != "" {
		c = "\n  cohortName: " + cohort
	}
	return fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: %[2]s-%[1]s
spec:%[5]s
  namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: %[1]s
  preemption:
    withinClusterQueue: %[6]s
  resourceGroups:
  - coveredResources: [pods]
    flavors:
    - name: %[3]s
      resources:
      - name: pods
        nominalQuota: %[4]d
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: %[2]s
  namespace: %[1]s
spec:
  clusterQueue: %[2]s-%[1]s
`, ns, name, flavor, pods, c, policy)
}

// kueueObjects are the ResourceFlavor and WorkloadPriorityClasses
// (low-NS 10, high-NS 1000) of a test in ns; their names are returned.
func kueueObjects(ns string) (docs, flavor, low, high string) {
	flavor, low, high = "flavor-"+ns, "low-"+ns, "high-"+ns
	return fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: %s
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: %s
value: 10
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: %s
value: 1000
`, flavor, low, high), flavor, low, high
}

// admittedWatch polls the Jobs of ns and records, per LocalQueue, the most
// Jobs admitted (unsuspended, unfinished) at once. One List is one
// revision of the cluster: Kueue admits a Job only after the one whose
// quota it takes is finished, so a snapshot never shows both.
type admittedWatch struct {
	mu   sync.Mutex
	most map[string]int
	stop context.CancelFunc
	done chan struct{}
}

func watchAdmitted(ctx context.Context, cfg *envconf.Config, ns string) *admittedWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &admittedWatch{most: map[string]int{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			var jobs batchv1.JobList
			if err := cfg.Client().Resources(ns).List(ctx, &jobs); err == nil {
				now := map[string]int{}
				for _, j := range jobs.Items {
					if q := j.Labels[job.LabelQueueName]; q != "" && !ptr.Deref(j.Spec.Suspend, false) && !job.Finished(&j) {
						now[q]++
					}
				}
				w.mu.Lock()
				for q, n := range now {
					w.most[q] = max(w.most[q], n)
				}
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *admittedWatch) maxima() map[string]int {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.most)
}

// queuedTask is a RunnerTask that sleeps, in a queue, at a priority.
func queuedTask(ns, name, queue, priority string, seconds int) *v1alpha1.RunnerTask {
	rt := runnerTask(ns, name, fmt.Sprintf("sleep %d", seconds))
	rt.Spec.Queue, rt.Spec.PriorityClass = queue, priority
	return rt
}

// waitTasks waits until every RunnerTask of ns has finished, and returns
// them by name.
func waitTasks(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, n int, timeout time.Duration, d *dispatcherProcess) map[string]v1alpha1.RunnerTask {
	t.Helper()
	out := map[string]v1alpha1.RunnerTask{}
	done := func(ctx context.Context) (bool, error) {
		var list v1alpha1.RunnerTaskList
		if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
			return false, nil
		}
		clear(out)
		finished := 0
		for _, rt := range list.Items {
			out[rt.Name] = rt
			if terminalPhase(rt.Status.Phase) {
				finished++
			}
		}
		return finished == n, nil
	}
	if err := harness.WaitFor(ctx, fmt.Sprintf("%d RunnerTasks to finish", n), timeout, done); err != nil {
		phases := map[v1alpha1.Phase]int{}
		for _, rt := range out {
			phases[rt.Status.Phase]++
		}
		t.Fatalf("%v (phases %v)\ndispatcher log:\n%s", err, phases, tail(d.log.String(), 4000))
	}
	return out
}

// oneJobEach checks that each task of ns ran in exactly one Job, all
// succeeded.
func oneJobEach(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, tasks map[string]v1alpha1.RunnerTask) {
	t.Helper()
	jobs := map[string]int{}
	for _, j := range jobsOf(ctx, t, cfg, ns) {
		jobs[j.Annotations[contract.TaskID]]++
	}
	for name, rt := range tasks {
		if rt.Status.Phase != v1alpha1.PhaseSucceeded {
			t.Errorf("task %s: %s/%s %q", name, rt.Status.Phase, rt.Status.Reason, rt.Status.Message)
		}
		if n := jobs[kube.TaskID(&rt)]; n > 1 {
			t.Errorf("task %s ran in %d Jobs", name, n)
		}
	}
}

// kueueSetup is the setup of a feature that runs RunnerTasks on the real
// node through Kueue.
func kueueSetup(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
	harness.RequireRealNode(ctx, t, cfg)
	installCRD(ctx, t, cfg)
	kueueNamespace(ctx, t, cfg)
	return ctx
}

// TestKueueQueues: with --kueue, Kueue (real) decides which tasks run. Two
// teams' LocalQueues on ClusterQueues of 2 and 5 pods never run more at
// once; a high-priority task submitted last starts before waiting
// low-priority ones; a cancelled queued task never runs; a dispatcher
// killed while tasks are queued loses and duplicates none; in a cohort, a
// team borrows another's unused quota; a task Kueue preempts ends
// Preempted and does not run again.
func TestKueueQueues(t *testing.T) {
	t.Parallel()
	kueueUp(t.Context(), t)
	f := features.New("kueue queues").
		Setup(kueueSetup).
		Assess("quotas, priority, cancellation, restarts", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			objs, flavor, low, high := kueueObjects(ns)
			applyObjects(ctx, t, cfg, objs+"---\n"+
				clusterQueue(ns, "team-a", flavor, "", 2, false)+"---\n"+
				clusterQueue(ns, "team-b", flavor, "", 5, false)+"---\n"+
				clusterQueue(ns, "held", flavor, "", 0, false))
			r := cfg.Client().Resources(ns)
			args := []string{"--kueue", "--default-queue", "team-a", "--max-concurrent", "20", "--max-queued", "40"}
			d := startDispatcher(ctx, t, cfg, ns, args...)

			// Quotas: 15 tasks each for team-a (2 pods) and team-b (5).
			w := watchAdmitted(ctx, cfg, ns)
			for i := range 15 {
				for _, team := range []string{"team-a", "team-b"} {
					if err := r.Create(ctx, queuedTask(ns, fmt.Sprintf("%s-%02d", team, i), team, "", 2)); err != nil {
						t.Fatal(err)
					}
				}
			}
			// One task waits where nothing is admitted, and is cancelled.
			held := queuedTask(ns, "held", "held", "", 1)
			if err := r.Create(ctx, held); err != nil {
				t.Fatal(err)
			}
			// Queued at once; Kueue's reason once it has made the Workload.
			queued := func(ctx context.Context) (bool, error) {
				err := r.Get(ctx, held.Name, ns, held)
				return err == nil && held.Status.Phase == v1alpha1.PhaseQueued && strings.Contains(held.Status.Message, "quota"), nil
			}
			if err := harness.WaitFor(ctx, "the held task to be Queued with Kueue's reason", time.Minute, queued); err != nil {
				t.Fatalf("%v: %+v\n%s", err, held.Status, tail(d.log.String(), 3000))
			}
			if held.Status.Reason != job.ReasonQueued || !strings.HasPrefix(held.Status.Message, "queued in LocalQueue held: ") {
				t.Errorf("the held task: %s %q, want Queued naming its queue", held.Status.Reason, held.Status.Message)
			} else {
				t.Logf("a queued task: %s: %s", held.Status.Reason, held.Status.Message)
			}
			held.Spec.Cancel = true
			if err := r.Update(ctx, held); err != nil {
				t.Fatal(err)
			}
			tasks := waitTasks(ctx, t, cfg, ns, 31, 8*time.Minute, d)
			most := w.maxima()
			t.Logf("most admitted at once: %v", most)
			if most["team-a"] != 2 || most["team-b"] != 5 {
				t.Errorf("most admitted at once %v; want team-a 2 and team-b 5, their quotas (never more, and reached)", most)
			}
			if got := tasks["held"]; got.Status.Phase != v1alpha1.PhaseCancelled {
				t.Errorf("the cancelled queued task: %+v", got.Status)
			}
			delete(tasks, "held")
			oneJobEach(ctx, t, cfg, ns, tasks)
			var pods corev1.PodList
			if err := r.List(ctx, &pods); err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				if strings.Contains(p.Annotations[contract.TaskID], "/held/") {
					t.Errorf("pod %s ran for the cancelled queued task", p.Name)
				}
			}
			for name, rt := range tasks {
				j := batchv1.Job{}
				if err := r.Get(ctx, rt.Status.JobName, ns, &j); err == nil && j.Labels[job.LabelQueueName] != strings.TrimSuffix(name[:6], "-") {
					t.Errorf("task %s's Job queue label %q", name, j.Labels[job.LabelQueueName])
				}
			}

			// Priority: six low tasks fill team-a and wait; a high one
			// submitted last starts while low ones still wait.
			for i := range 6 {
				if err := r.Create(ctx, queuedTask(ns, fmt.Sprintf("low-%d", i), "", low, 3)); err != nil {
					t.Fatal(err)
				}
			}
			lowWaiting := func(ctx context.Context) (int, error) {
				var list v1alpha1.RunnerTaskList
				if err := r.List(ctx, &list); err != nil {
					return 0, err
				}
				n := 0
				for _, rt := range list.Items {
					if strings.HasPrefix(rt.Name, "low-") && rt.Status.StartTime == nil && !terminalPhase(rt.Status.Phase) {
						n++
					}
				}
				return n, nil
			}
			full := func(ctx context.Context) (bool, error) {
				n, err := lowWaiting(ctx)
				return err == nil && n == 4, nil
			}
			if err := harness.WaitFor(ctx, "two low tasks to run and four to wait", time.Minute, full); err != nil {
				t.Fatal(err)
			}
			hi := queuedTask(ns, "high", "", high, 1)
			if err := r.Create(ctx, hi); err != nil {
				t.Fatal(err)
			}
			var waitingThen int
			started := func(ctx context.Context) (bool, error) {
				if err := r.Get(ctx, hi.Name, ns, hi); err != nil || hi.Status.StartTime == nil {
					return false, nil
				}
				n, err := lowWaiting(ctx)
				waitingThen = n
				return err == nil, nil
			}
			if err := harness.WaitForEvery(ctx, "the high-priority task to start", 2*time.Minute, 50*time.Millisecond, started); err != nil {
				t.Fatal(err)
			}
			t.Logf("when the high-priority task started, %d low-priority tasks submitted before it still waited", waitingThen)
			if waitingThen == 0 {
				t.Error("the high-priority task submitted last started after every waiting low-priority one")
			}
			waitTasks(ctx, t, cfg, ns, 38, 5*time.Minute, d)

			// SIGKILL while tasks are queued: none lost, none run twice.
			for i := range 8 {
				if err := r.Create(ctx, queuedTask(ns, fmt.Sprintf("kill-%d", i), "team-a", "", 2)); err != nil {
					t.Fatal(err)
				}
			}
			someQueued := func(ctx context.Context) (bool, error) {
				var list v1alpha1.RunnerTaskList
				if err := r.List(ctx, &list); err != nil {
					return false, nil
				}
				n := 0
				for _, rt := range list.Items {
					if strings.HasPrefix(rt.Name, "kill-") && rt.Status.Phase == v1alpha1.PhaseQueued {
						n++
					}
				}
				return n >= 5, nil
			}
			if err := harness.WaitFor(ctx, "five tasks to be queued", time.Minute, someQueued); err != nil {
				t.Fatal(err)
			}
			d.stop(syscall.SIGKILL)
			d = startDispatcher(ctx, t, cfg, ns, args...)
			tasks = waitTasks(ctx, t, cfg, ns, 46, 5*time.Minute, d)
			delete(tasks, "held")
			oneJobEach(ctx, t, cfg, ns, tasks)
			return ctx
		}).Feature()
	lend := features.New("kueue cohorts and preemption").
		Setup(kueueSetup).
		Assess("a cohort lends, and a preempted task is not run again", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			objs, flavor, low, high := kueueObjects(ns)
			applyObjects(ctx, t, cfg, objs+"---\n"+
				clusterQueue(ns, "lender", flavor, "cohort-"+ns, 3, false)+"---\n"+
				clusterQueue(ns, "borrower", flavor, "cohort-"+ns, 2, false)+"---\n"+
				clusterQueue(ns, "strict", flavor, "", 1, true))
			r := cfg.Client().Resources(ns)
			d := startDispatcher(ctx, t, cfg, ns, "--kueue", "--default-queue", "borrower", "--max-concurrent", "20")
			w := watchAdmitted(ctx, cfg, ns)
			for i := range 6 {
				if err := r.Create(ctx, queuedTask(ns, fmt.Sprintf("borrow-%d", i), "borrower", "", 3)); err != nil {
					t.Fatal(err)
				}
			}
			var borrowed string
			lent := func(ctx context.Context) (bool, error) {
				cq := &unstructured.Unstructured{}
				cq.SetAPIVersion("kueue.x-k8s.io/v1beta2")
				cq.SetKind("ClusterQueue")
				if err := cfg.Client().Resources().Get(ctx, "borrower-"+ns, "", cq); err != nil {
					return false, nil
				}
				usage, _, _ := unstructured.NestedSlice(cq.Object, "status", "flavorsUsage")
				for _, u := range usage {
					res, _, _ := unstructured.NestedSlice(u.(map[string]any), "resources")
					for _, x := range res {
						if b := fmt.Sprint(x.(map[string]any)["borrowed"]); b != "" && b != "0" && b != "<nil>" {
							borrowed = b
							return true, nil
						}
					}
				}
				return false, nil
			}
			if err := harness.WaitForEvery(ctx, "the borrower's ClusterQueue to borrow", 2*time.Minute, 100*time.Millisecond, lent); err != nil {
				t.Error(err)
			}
			waitTasks(ctx, t, cfg, ns, 6, 3*time.Minute, d)
			most := w.maxima()
			t.Logf("the borrower's ClusterQueue borrowed %s pods; most admitted at once: %v", borrowed, most)
			if most["borrower"] <= 2 || most["borrower"] > 5 {
				t.Errorf("most admitted at once in the borrower's queue %d; want more than its quota of 2 (borrowed), at most 5", most["borrower"])
			}

			// Preemption: a high-priority task takes the only slot of a
			// ClusterQueue that preempts; the low one it evicts ends
			// Preempted, and its Job is gone rather than waiting to run again.
			victim := queuedTask(ns, "victim", "strict", low, 60)
			if err := r.Create(ctx, victim); err != nil {
				t.Fatal(err)
			}
			running := func(ctx context.Context) (bool, error) {
				err := r.Get(ctx, victim.Name, ns, victim)
				return err == nil && victim.Status.Phase == v1alpha1.PhaseRunning, nil
			}
			if err := harness.WaitFor(ctx, "the low-priority task to run", time.Minute, running); err != nil {
				t.Fatal(err)
			}
			if err := r.Create(ctx, queuedTask(ns, "preemptor", "strict", high, 1)); err != nil {
				t.Fatal(err)
			}
			got := waitPhase(ctx, t, cfg, victim, d)
			if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != job.ReasonPreempted || !strings.Contains(got.Status.Message, "Preempted to accommodate") {
				t.Errorf("the preempted task: %s/%s %q; want Failed/Preempted with Kueue's message", got.Status.Phase, got.Status.Reason, got.Status.Message)
			} else {
				t.Logf("the preempted task: %s: %s", got.Status.Reason, got.Status.Message)
			}
			gone := func(ctx context.Context) (bool, error) {
				err := r.Get(ctx, got.Status.JobName, ns, &batchv1.Job{})
				return client.IgnoreNotFound(err) == nil && err != nil, nil
			}
			if err := harness.WaitFor(ctx, "the preempted task's Job to be deleted", time.Minute, gone); err != nil {
				t.Error(err)
			}
			tasks := waitTasks(ctx, t, cfg, ns, 8, 2*time.Minute, d)
			if p := tasks["preemptor"]; p.Status.Phase != v1alpha1.PhaseSucceeded {
				t.Errorf("the preemptor: %+v", p.Status)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f, lend)
}

// TestKueueOrchestratorTasks: orchestrator tasks name their queue and
// priority class; the dispatcher reports queued, with the queue, to the
// orchestrator; Kueue's quota bounds what runs, and each task runs once.
func TestKueueOrchestratorTasks(t *testing.T) {
	t.Parallel()
	kueueUp(t.Context(), t)
	f := features.New("kueue orchestrator tasks").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			kueueNamespace(ctx, t, cfg)
			return ctx
		}).
		Assess("queued events and the quota", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			objs, flavor, _, high := kueueObjects(ns)
			applyObjects(ctx, t, cfg, objs+"---\n"+clusterQueue(ns, "team-a", flavor, "", 2, false))
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 30})
			w := watchAdmitted(ctx, cfg, ns)
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--simulated", "--kueue", "--max-concurrent", "10", "--max-queued", "4")
			for i := range 10 {
				o.srv.Add(orchestrator.Task{ID: fmt.Sprintf("q-%d", i), Command: []string{"true"}, Queue: "team-a", PriorityClass: high})
			}
			waitAllDone(ctx, t, o.srv, 10, 3*time.Minute, d)
			most := w.maxima()
			queuedEvents := 0
			for i := range 10 {
				rec := o.srv.Task(fmt.Sprintf("q-%d", i))
				if rec.Final == nil || rec.Final.Type != orchestrator.EventSucceeded || rec.FinalStored != 1 {
					t.Errorf("task q-%d: final %+v, %d stored", i, rec.Final, rec.FinalStored)
				}
				for _, e := range rec.Events {
					if e.Type == orchestrator.EventQueued {
						queuedEvents++
						if !strings.Contains(e.Message, "queued in LocalQueue team-a") {
							t.Errorf("task q-%d's queued event: %q", i, e.Message)
						}
					}
				}
			}
			t.Logf("most admitted at once: %v; %d of 10 tasks reported queued", most, queuedEvents)
			if most["team-a"] > 2 || most["team-a"] == 0 {
				t.Errorf("most admitted at once %v; want team-a's quota of 2 at most", most)
			}
			if queuedEvents == 0 {
				t.Error("no task was reported queued, with 10 tasks on a quota of 2")
			}
			for _, j := range jobsOf(ctx, t, cfg, ns) {
				if j.Labels[job.LabelQueueName] != "team-a" || j.Labels[job.LabelPriorityClass] != high {
					t.Errorf("Job %s labels %v; want the task's queue and priority class", j.Name, j.Labels)
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestDispatcherStartsWaitingTasksInOrder: without Kueue, tasks waiting for
// the dispatcher's slots start in priority order, then creation order.
func TestDispatcherStartsWaitingTasksInOrder(t *testing.T) {
	t.Parallel()
	f := features.New("waiting tasks in order").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("priority, then FIFO", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			// Made one by one, a second apart (creation times have seconds).
			made := []struct{ name, class string }{
				{"a-low", "low"}, {"b-none", ""}, {"c-high", "high"}, {"d-none", ""}, {"e-high", "high"}, {"f-low", "low"},
			}
			want := []string{"c-high", "e-high", "b-none", "d-none", "a-low", "f-low"}
			for i, m := range made {
				if i > 0 {
					time.Sleep(1100 * time.Millisecond)
				}
				if err := r.Create(ctx, queuedTask(ns, m.name, "", m.class, 1)); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			var order []string
			seen := map[string]bool{}
			record := func(ctx context.Context) (bool, error) {
				var list v1alpha1.RunnerTaskList
				if err := r.List(ctx, &list); err != nil {
					return false, nil
				}
				slices.SortFunc(list.Items, func(a, b v1alpha1.RunnerTask) int { return strings.Compare(a.Name, b.Name) })
				mu.Lock()
				defer mu.Unlock()
				for _, rt := range list.Items {
					if rt.Status.JobName != "" && !seen[rt.Name] {
						seen[rt.Name] = true
						order = append(order, rt.Name)
					}
				}
				return len(order) == len(made), nil
			}
			d := startDispatcher(ctx, t, cfg, ns, "--max-concurrent", "1", "--priority-class", "high=100", "--priority-class", "low=-5")
			if err := harness.WaitForEvery(ctx, "every task to start", 6*time.Minute, 50*time.Millisecond, record); err != nil {
				t.Fatalf("%v (started %v)\n%s", err, order, tail(d.log.String(), 3000))
			}
			t.Logf("started in order %v", order)
			if !slices.Equal(order, want) {
				t.Errorf("tasks started in order %v; want %v (priority, then creation)", order, want)
			}
			waitTasks(ctx, t, cfg, ns, len(made), 2*time.Minute, d)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

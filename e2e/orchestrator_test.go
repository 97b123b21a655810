//go:build e2e

package e2e

import (
	"context"
	"crypto/ed25519"
	crand "crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/e2e/harness"
)

// fakeOrchestrator is the fault-injecting orchestrator on loopback, with
// the files a dispatcher needs to reach it: its CA and an Ed25519 key whose
// public half the orchestrator trusts.
type fakeOrchestrator struct {
	srv     *orchestratortest.Server
	caFile  string
	keyFile string
}

func newOrchestrator(t testing.TB, opts orchestratortest.Options) *fakeOrchestrator {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "runner.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	opts.PublicKey = pub
	srv := orchestratortest.New(opts)
	srv.Start()
	t.Cleanup(srv.Close)
	caFile, err := srv.CAFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeOrchestrator{srv: srv, caFile: caFile, keyFile: keyFile}
}

// startOrchestratorDispatcher starts the dispatcher with the orchestrator
// source pointed at o.
func startOrchestratorDispatcher(ctx context.Context, t testing.TB, cfg *envconf.Config, ns string, o *fakeOrchestrator, extra ...string) *dispatcherProcess {
	t.Helper()
	return startDispatcher(ctx, t, cfg, ns, append(orchestratorFlags(o), extra...)...)
}

// orchestratorFlags point a dispatcher at o.
func orchestratorFlags(o *fakeOrchestrator) []string {
	return []string{
		"--source=orchestrator", "--orchestrator-url", o.srv.URL(), "--orchestrator-ca", o.caFile,
		"--orchestrator-key", o.keyFile, "--poll-wait", "5s", "--retry-max-delay", "2s",
	}
}

// orchestratorTasks adds n tasks that succeed at once on simulated nodes.
func orchestratorTasks(srv *orchestratortest.Server, prefix string, n int) []string {
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		srv.Add(orchestrator.Task{ID: ids[i], Command: []string{"true"}, Env: []orchestrator.EnvVar{{Name: "GREETING", Value: "hi"}}})
	}
	return ids
}

// checkCancelledOnce asserts every cancelled task ended with exactly one
// stored final event, cancelled (by its dispatcher or, when none held it,
// by the orchestrator) or succeeded (it finished first), and left at most
// one Job.
func checkCancelledOnce(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, srv *orchestratortest.Server, ids []string) {
	t.Helper()
	jobs := map[string]int{}
	for _, j := range jobsOf(ctx, t, cfg, ns) {
		jobs[j.Annotations["runwarden.dev/task-id"]]++
	}
	by := map[string]int{}
	for _, id := range ids {
		rec := srv.Task(id)
		switch {
		case rec.FinalStored != 1 || rec.Final == nil || jobs[id] > 1 || rec.BadKeys != 0:
			t.Errorf("cancelled task %s: %d final events stored (final %+v), %d Jobs", id, rec.FinalStored, rec.Final, jobs[id])
		case rec.Final.Type == orchestrator.EventCancelled && rec.EndedByOrchestrator:
			by["cancelled by the orchestrator"]++
		case rec.Final.Type == orchestrator.EventCancelled:
			by["cancelled by the dispatcher"]++
		case rec.Final.Type == orchestrator.EventSucceeded:
			by["succeeded before the cancel"]++
		default:
			t.Errorf("cancelled task %s ended %+v", id, rec.Final)
		}
	}
	t.Logf("cancelled tasks: %v", by)
}

// checkExactlyOnce asserts every task ended succeeded with exactly one
// stored final event and exactly one Job.
func checkExactlyOnce(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, srv *orchestratortest.Server, ids []string) {
	t.Helper()
	jobs := map[string]int{}
	for _, j := range jobsOf(ctx, t, cfg, ns) {
		jobs[j.Annotations["runwarden.dev/task-id"]]++
	}
	bad := 0
	for _, id := range ids {
		rec := srv.Task(id)
		if rec.FinalStored != 1 || rec.Final == nil || rec.Final.Type != orchestrator.EventSucceeded || jobs[id] != 1 || rec.BadKeys != 0 {
			bad++
			if bad <= 10 {
				t.Errorf("task %s: %d final events stored (final %+v), %d Jobs, %d leases", id, rec.FinalStored, rec.Final, jobs[id], len(rec.Leases))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d tasks broke exactly-once", bad, len(ids))
	}
	// Every Job ends marked reported: no task stays held by the dispatcher
	// after the orchestrator stored its outcome (a lost answer included).
	// The list goes through the wait's own context: one cut short by the
	// deadline is a "not yet", so the failure below names the Job left.
	marked := func(ctx context.Context) (bool, error) {
		var list batchv1.JobList
		if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
			return false, nil // retried until the deadline
		}
		for _, j := range list.Items {
			if j.Annotations["runwarden.dev/reported"] != "true" {
				return false, nil
			}
		}
		return true, nil
	}
	if err := harness.WaitFor(ctx, "every Job to be marked reported", time.Minute, marked); err != nil {
		for _, j := range jobsOf(ctx, t, cfg, ns) {
			if j.Annotations["runwarden.dev/reported"] != "true" {
				t.Errorf("%v: Job %s (task %s) is not marked reported", err, j.Name, j.Annotations["runwarden.dev/task-id"])
				break
			}
		}
	}
	for _, p := range srv.Polls() {
		if p.Capacity.Free < 0 || p.Capacity.Free > p.Capacity.Max {
			t.Errorf("poll asked for capacity %+v", p.Capacity)
			break
		}
	}
}

func waitAllDone(ctx context.Context, t *testing.T, srv *orchestratortest.Server, n int, timeout time.Duration, d *dispatcherProcess) {
	t.Helper()
	done := func(context.Context) (bool, error) { return srv.Done() == n, nil }
	if err := harness.WaitFor(ctx, fmt.Sprintf("all %d tasks to be reported", n), timeout, done); err != nil {
		t.Fatalf("%v (%d done)\n%s\n%s", err, srv.Done(), undone(srv), tail(d.log.String(), 4000))
	}
}

// undone says, a line each, what the orchestrator holds of the first ten
// tasks without a final event: why a wait for them all ended.
func undone(srv *orchestratortest.Server) string {
	var b strings.Builder
	left := 0
	for _, r := range srv.Tasks() {
		if r.Final != nil {
			continue
		}
		if left++; left > 10 {
			continue
		}
		var events []string
		for _, e := range r.Events {
			events = append(events, string(e.Type))
		}
		fmt.Fprintf(&b, "  task %s: queued %v, leased %v (epoch %d, holder %q, expires %s), %d leases, %d requeues, %d releases, cancelled %v, events %v, %d stale\n",
			r.Task.ID, r.Queued, r.Leased, r.Epoch, r.Holder, r.ExpiresAt.Format(time.TimeOnly), len(r.Leases), r.Requeues, r.Releases, r.Cancelled, events, r.Stale)
	}
	return fmt.Sprintf("%d tasks not reported:\n%s", left, b.String())
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// TestOrchestratorSecretsAndAuth runs a task with secret values on the real
// node, authenticated with an Ed25519 JWT: the values reach the runner
// through a Secret the Job owns, never as literals in the Job. Three more
// tasks then check the succeeded history limit.
func TestOrchestratorSecretsAndAuth(t *testing.T) {
	t.Parallel()
	f := features.New("orchestrator source: secrets").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			return ctx
		}).
		Assess("secretEnv goes into a Secret owned by the Job", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			// A reported Job is kept a lease and a poll wait (5 s) as the
			// record that its lease ended: 15 s here, within the wait for
			// the history below.
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 10})
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--preflight=false", "--succeeded-history", "2")
			o.srv.Add(orchestrator.Task{
				ID: "with-secret", Command: []string{"/bin/sh", "-c", `echo "token has ${#TF_VAR_token} characters"`},
				SecretEnv: map[string]string{"TF_VAR_token": "s3cr3t-value"},
			})
			waitAllDone(ctx, t, o.srv, 1, 2*time.Minute, d)
			rec := o.srv.Task("with-secret")
			if rec.Final.Type != orchestrator.EventSucceeded || string(rec.Log) != "token has 12 characters\n" {
				t.Errorf("final %+v, log %q", rec.Final, rec.Log)
			}
			jobs := jobsFor(ctx, t, cfg, ns, "with-secret")
			if len(jobs) != 1 {
				t.Fatalf("%d Jobs", len(jobs))
			}
			j := jobs[0]
			out, err := suite.Kubectl(ctx, cfg, "get", "job", "-n", ns, j.Name, "-o", "yaml")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out, "s3cr3t-value") {
				t.Error("the secret value is in the Job")
			}
			var secret corev1.Secret
			if err := cfg.Client().Resources(ns).Get(ctx, job.SecretName(j.Name), ns, &secret); err != nil {
				t.Fatalf("the task's Secret: %v", err)
			}
			if len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].UID != j.UID {
				t.Errorf("Secret owners %+v, want the Job %s", secret.OwnerReferences, j.UID)
			}
			if string(secret.Data["TF_VAR_token"]) != "s3cr3t-value" {
				t.Errorf("Secret data %v", secret.Data)
			}
			if j.Annotations["runwarden.dev/reported"] != "true" {
				t.Errorf("Job annotations %v: not marked reported", j.Annotations)
			}

			// History: two succeeded Jobs are kept, the oldest go.
			for i := range 3 {
				o.srv.Add(orchestrator.Task{ID: fmt.Sprintf("more-%d", i), Command: []string{"true"}})
			}
			waitAllDone(ctx, t, o.srv, 4, 2*time.Minute, d)
			kept := func(ctx context.Context) (bool, error) {
				var jobs batchv1.JobList
				if err := cfg.Client().Resources(ns).List(ctx, &jobs); err != nil {
					return false, nil
				}
				n := 0
				for _, j := range jobs.Items {
					if j.DeletionTimestamp == nil {
						n++
					}
				}
				return n == 2, nil
			}
			if err := harness.WaitFor(ctx, "two succeeded Jobs to be kept", 30*time.Second, kept); err != nil {
				for _, j := range jobsOf(ctx, t, cfg, ns) {
					t.Logf("Job %s: reported %q, finished %v, deleting %v", j.Name, j.Annotations["runwarden.dev/reported"], j.Status.CompletionTime, j.DeletionTimestamp)
				}
				t.Errorf("%v\n%s", err, tail(d.log.String(), 3000))
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestOrchestratorStartsOverAfterAStopAwaitingTheSecret: a dispatcher
// stopped after making a task's Job (suspended, awaiting its Secret) but
// before the Secret: a ResourceQuota of no Secrets holds it there, and it
// is SIGKILLed. The values came with the lease and are kept nowhere, so the
// restarted dispatcher deletes the Job and hands the lease back; the task
// runs from its next lease, once, with its Secret owned by its Job.
func TestOrchestratorStartsOverAfterAStopAwaitingTheSecret(t *testing.T) {
	t.Parallel()
	f := features.New("orchestrator source: a stop before the task's Secret").
		Assess("the task starts over from a new lease", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			quota := &corev1.ResourceQuota{
				ObjectMeta: metav1.ObjectMeta{Name: "no-secrets", Namespace: ns},
				Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceSecrets: resource.MustParse("0")}},
			}
			if err := r.Create(ctx, quota); err != nil {
				t.Fatal(err)
			}
			counted := func(ctx context.Context) (bool, error) {
				var q corev1.ResourceQuota
				if err := r.Get(ctx, quota.Name, ns, &q); err != nil {
					return false, err
				}
				_, ok := q.Status.Used[corev1.ResourceSecrets]
				return ok, nil
			}
			if err := harness.WaitFor(ctx, "the quota to be counted", time.Minute, counted); err != nil {
				t.Fatal(err)
			}
			// The first Job never runs: no pod of it, ever, beside the
			// second's (the watch's rule that no task has pods of two Jobs).
			watch := harness.WatchJobs(ctx, t, cfg, ns, 5)
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 30})
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--simulated", "--preflight=false")
			o.srv.Add(orchestrator.Task{ID: "stopped", Command: []string{"true"}, SecretEnv: map[string]string{"TF_VAR_token": "s3cr3t"}})
			var first batchv1.Job
			awaiting := func(ctx context.Context) (bool, error) {
				jobs := jobsFor(ctx, t, cfg, ns, "stopped")
				if len(jobs) != 1 || jobs[0].Annotations[job.AnnotationAwaitingSecret] == "" || !strings.Contains(d.log.String(), "exceeded quota") {
					return false, nil
				}
				first = jobs[0]
				return true, nil
			}
			if err := harness.WaitFor(ctx, "the Job to await its Secret", time.Minute, awaiting); err != nil {
				t.Fatalf("%v\n%s", err, tail(d.log.String(), 3000))
			}
			if first.Spec.Suspend == nil || !*first.Spec.Suspend {
				t.Fatalf("the Job awaiting its Secret is not suspended: %v", first.Spec.Suspend)
			}
			var pods corev1.PodList
			if err := r.List(ctx, &pods); err != nil || len(pods.Items) != 0 {
				t.Fatalf("%d pods (%v) before the Secret exists, want none", len(pods.Items), err)
			}
			d.stop(os.Kill)
			if err := r.Delete(ctx, quota); err != nil {
				t.Fatal(err)
			}
			d.start(ctx, t)
			waitAllDone(ctx, t, o.srv, 1, 2*time.Minute, d)
			checkExactlyOnce(ctx, t, cfg, ns, o.srv, []string{"stopped"})
			if rec := o.srv.Task("stopped"); rec.Releases != 1 || len(rec.Leases) != 2 {
				t.Errorf("%d leases handed back, %d leases; want the first handed back and a second", rec.Releases, len(rec.Leases))
			}
			jobs := jobsFor(ctx, t, cfg, ns, "stopped")
			if len(jobs) != 1 || jobs[0].UID == first.UID {
				t.Fatalf("Jobs %d (the first %s), want one new Job", len(jobs), first.UID)
			}
			var secret corev1.Secret
			if err := r.Get(ctx, job.SecretName(jobs[0].Name), ns, &secret); err != nil {
				t.Fatalf("the task's Secret: %v", err)
			}
			if owner := metav1.GetControllerOf(&secret); owner == nil || owner.UID != jobs[0].UID {
				t.Errorf("Secret owners %+v, want the Job %s", secret.OwnerReferences, jobs[0].UID)
			}
			watch.Check(ctx, t)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestOrchestratorSurvivesSIGKILLAndFaults runs 200 tasks through two
// replicas with --leader-elect while the orchestrator delivers leases
// twice, drops responses and fails requests, and the leader is killed with
// SIGKILL ten times at random moments and then in each narrow window: after
// a lease it never saw, between the Job's creation and its acknowledgement,
// and after the Job finished but before the report was acknowledged. The
// standby takes over each time. Every task ends with exactly one Job and
// exactly one final status, and never more than --max-concurrent run.
func TestOrchestratorSurvivesSIGKILLAndFaults(t *testing.T) {
	// Beside other tests: electionFlags.
	t.Parallel()
	const tasks, kills = 200, 10
	f := features.New("orchestrator source survives SIGKILL and faults").
		Assess("200 tasks, two replicas, the leader killed 13 times, one Job and one final status each", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 4, MaxWait: 2 * time.Second, Seed: 3})
			o.srv.SetFaults(orchestratortest.Faults{DuplicateLeaseRate: 0.2, DropResponseRate: 0.05, ErrorRate: 0.05})
			rs := startReplicas(ctx, t, cfg, ns, 2, slices.Concat(orchestratorFlags(o), []string{"--simulated", "--max-concurrent", "40",
				"--succeeded-history", "1000", "--failed-history", "1000", "--preflight=false", "--stream-logs=false"}, electionFlags)...)
			watch := harness.WatchJobs(ctx, t, cfg, ns, 40)
			// Tasks keep arriving across the kills, and some are cancelled
			// at random moments: queued, leased, running or done; each must
			// still end exactly once.
			var ids, cancels []string
			rng := rand.New(rand.NewPCG(5, 9))
			for k := range kills {
				ids = append(ids, orchestratorTasks(o.srv, fmt.Sprintf("task-%d", k), tasks/kills)...)
				pair := orchestratorTasks(o.srv, fmt.Sprintf("cancel-%d", k), 2)
				cancels = append(cancels, pair...)
				o.srv.Cancel(pair[0], "chaos")
				time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
				o.srv.Cancel(pair[1], "chaos")
				rs.killLeader(ctx, t)
			}
			o.srv.SetFaults(orchestratortest.Faults{})

			// Narrow windows, each with its own tasks.
			windows := []struct {
				name  string
				fault orchestratortest.Faults
				held  func(orchestratortest.Stats) bool
			}{
				{"lease never seen", orchestratortest.Faults{DropResponseRate: 1, Endpoints: []orchestratortest.Endpoint{orchestratortest.EndpointPoll}},
					func(s orchestratortest.Stats) bool { return s.DroppedResponses > 0 }},
				{"created, not acknowledged", orchestratortest.Faults{Hold: []orchestrator.EventType{orchestrator.EventJobCreated}},
					func(s orchestratortest.Stats) bool { return s.Held > 0 }},
				{"finished, not reported", orchestratortest.Faults{Hold: []orchestrator.EventType{orchestrator.EventSucceeded}},
					func(s orchestratortest.Stats) bool { return s.Held > 0 }},
			}
			for i, w := range windows {
				l := rs.waitLeader(ctx, t)
				before := o.srv.Stats()
				o.srv.SetFaults(w.fault)
				ids = append(ids, orchestratorTasks(o.srv, fmt.Sprintf("window-%d", i), 5)...)
				inWindow := func(context.Context) (bool, error) {
					s := o.srv.Stats()
					s.DroppedResponses -= before.DroppedResponses
					s.Held -= before.Held
					return w.held(s), nil
				}
				if err := harness.WaitFor(ctx, "the leader to be in window "+w.name, time.Minute, inWindow); err != nil {
					t.Fatalf("%v\n%s", err, rs.logs())
				}
				rs.stop(l, os.Kill)
				o.srv.SetFaults(orchestratortest.Faults{})
				o.srv.Release()
				rs.startStandby(ctx, t, l)
			}
			waitAllDone(ctx, t, o.srv, len(ids)+len(cancels), 6*time.Minute, rs.waitLeader(ctx, t))
			checkExactlyOnce(ctx, t, cfg, ns, o.srv, ids)
			checkCancelledOnce(ctx, t, cfg, ns, o.srv, cancels)
			watch.Check(ctx, t)
			st := o.srv.Stats()
			t.Logf("faults: %d duplicate leases, %d dropped responses, %d injected errors, %d requeues, %d re-issued", st.DuplicateLeases, st.DroppedResponses, st.InjectedErrors, st.Requeues, st.Reissued)
			if st.DuplicateLeases == 0 || st.DroppedResponses == 0 || st.InjectedErrors == 0 {
				t.Errorf("not every fault was met: %+v", st)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestOrchestratorUnreachableForAMinute cuts the orchestrator off for a
// minute while tasks run: their leases expire meanwhile, and once it is
// back every task is handed back, reported once, and none runs twice.
func TestOrchestratorUnreachableForAMinute(t *testing.T) {
	t.Parallel()
	f := features.New("orchestrator unreachable for a minute").
		Assess("nothing lost, nothing run twice", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 15, MaxWait: 2 * time.Second})
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--simulated", "--max-concurrent", "20",
				"--preflight=false", "--stream-logs=false", "--retry-max-delay", "5s", "--succeeded-history", "100")
			watch := harness.WatchJobs(ctx, t, cfg, ns, 20)
			ids := orchestratorTasks(o.srv, "before", 20)
			waitAllDone(ctx, t, o.srv, 20, time.Minute, d)
			// Leased, then cut off before the Jobs are reported.
			o.srv.SetFaults(orchestratortest.Faults{Hold: []orchestrator.EventType{orchestrator.EventJobCreated}})
			ids = append(ids, orchestratorTasks(o.srv, "during", 20)...)
			held := func(context.Context) (bool, error) { return o.srv.Stats().Held > 0, nil }
			if err := harness.WaitFor(ctx, "the new tasks to be leased", time.Minute, held); err != nil {
				t.Fatal(err)
			}
			until := time.Now().Add(time.Minute)
			o.srv.SetFaults(orchestratortest.Faults{UnreachableUntil: until})
			o.srv.Release()
			time.Sleep(time.Until(until))
			waitAllDone(ctx, t, o.srv, len(ids), 2*time.Minute, d)
			checkExactlyOnce(ctx, t, cfg, ns, o.srv, ids)
			watch.Check(ctx, t)
			st := o.srv.Stats()
			if st.Unreachable == 0 || st.Requeues == 0 {
				t.Errorf("the outage was not felt: %d requests cut off, %d leases expired", st.Unreachable, st.Requeues)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestOrchestratorSIGTERMStopsLeasing sends SIGTERM while a task runs: the
// dispatcher exits at once with status 0, takes no new lease, and leaves
// the running Job alone; the next dispatcher carries on with it.
func TestOrchestratorSIGTERMStopsLeasing(t *testing.T) {
	t.Parallel()
	f := features.New("orchestrator source: SIGTERM").
		Assess("stop leasing, leave Jobs running, exit", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 30, MaxWait: 2 * time.Second})
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--simulated", "--preflight=false", "--stream-logs=false", "--unschedulable-timeout", "1h")
			// Unschedulable, so it stays running until cancelled.
			o.srv.Add(orchestrator.Task{ID: "long", Command: []string{"true"}, Resources: &orchestrator.Resources{
				Requests: map[string]orchestrator.Quantity{"cpu": "100000"},
			}})
			created := func(context.Context) (bool, error) { return len(o.srv.Task("long").Events) > 0, nil }
			if err := harness.WaitFor(ctx, "the long task's Job", time.Minute, created); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			state, err := d.cmd.Process.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); state.ExitCode() != 0 || took > 10*time.Second {
				t.Errorf("after SIGTERM: exit %d after %s, want 0 at once\n%s", state.ExitCode(), took, tail(d.log.String(), 2000))
			}
			// The poll it had in flight ends when the server notices its
			// connection closed; a task added before that could go to it,
			// as to any poll whose client the server still takes as there.
			polling := func(context.Context) (bool, error) { return o.srv.Stats().PollsWaiting == 0, nil }
			if err := harness.WaitFor(ctx, "the stopped dispatcher's held poll to end", 10*time.Second, polling); err != nil {
				t.Fatal(err)
			}
			polls := o.srv.Stats().Requests[orchestratortest.EndpointPoll]
			o.srv.Add(orchestrator.Task{ID: "after", Command: []string{"true"}})
			time.Sleep(2 * time.Second)
			if got := o.srv.Stats().Requests[orchestratortest.EndpointPoll]; got != polls || len(o.srv.Task("after").Leases) != 0 {
				t.Errorf("a stopped dispatcher polled (%d -> %d) or leased", polls, got)
			}
			jobs := jobsFor(ctx, t, cfg, ns, "long")
			if len(jobs) != 1 || jobs[0].DeletionTimestamp != nil || jobs[0].Spec.Suspend != nil && *jobs[0].Spec.Suspend {
				t.Fatalf("the running Job was touched: %+v", jobs)
			}
			// The next dispatcher takes the task over and the new one too.
			d.start(ctx, t)
			o.srv.Cancel("long", "done waiting")
			waitAllDone(ctx, t, o.srv, 2, time.Minute, d)
			if f := o.srv.Task("long").Final; f.Type != orchestrator.EventCancelled || o.srv.Task("after").Final.Type != orchestrator.EventSucceeded {
				t.Errorf("long ended %+v, after ended %+v", f, o.srv.Task("after").Final)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// writeEd25519Key makes an Ed25519 key pair and writes the private half as
// PKCS #8 PEM into dir, as a dispatcher reads it.
func writeEd25519Key(t *testing.T, dir, name string) (ed25519.PublicKey, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return pub, path
}

// TestOrchestratorDispatcherCannotImpersonateAnother: two dispatchers of
// one orchestrator, each with its own key, run tasks on the API server; a
// third process holding dispatcher b's key and configured as dispatcher a
// (signing sub a under b's kid, or claiming a's kid) is refused at its first
// request and stops, saying why, having changed nothing of a's tasks.
func TestOrchestratorDispatcherCannotImpersonateAnother(t *testing.T) {
	t.Parallel()
	f := features.New("orchestrator: a dispatcher cannot act as another").
		Assess("each key signs only for its own dispatcher", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			dir := t.TempDir()
			pubA, keyA := writeEd25519Key(t, dir, "a.key")
			pubB, keyB := writeEd25519Key(t, dir, "b.key")
			idA, idB := "e2e-a-"+ns[len(ns)-6:], "e2e-b-"+ns[len(ns)-6:]
			srv := orchestratortest.New(orchestratortest.Options{LeaseSeconds: 30, MaxWait: 2 * time.Second, Dispatchers: []orchestratortest.Dispatcher{
				{ID: idA, KeyID: "key-a", PublicKey: pubA},
				{ID: idB, KeyID: "key-b", PublicKey: pubB},
			}})
			srv.Start()
			t.Cleanup(srv.Close)
			caFile, err := srv.CAFile(dir)
			if err != nil {
				t.Fatal(err)
			}
			flags := func(key, kid, id string) []string {
				return append(orchestratorFlags(&fakeOrchestrator{srv: srv, caFile: caFile, keyFile: key}),
					"--orchestrator-key-id", kid, "--dispatcher-id", id, "--simulated", "--preflight=false", "--stream-logs=false", "--succeeded-history", "100")
			}
			a := startDispatcher(ctx, t, cfg, ns, flags(keyA, "key-a", idA)...)
			b := startDispatcher(ctx, t, cfg, ns, flags(keyB, "key-b", idB)...)
			ids := orchestratorTasks(srv, "own", 6)
			waitAllDone(ctx, t, srv, len(ids), 2*time.Minute, a)
			for _, id := range ids {
				rec := srv.Task(id)
				if rec.Final == nil || rec.Final.Type != orchestrator.EventSucceeded || (rec.Holder != idA && rec.Holder != idB) {
					t.Errorf("task %s: %+v, want succeeded under a or b", id, rec)
				}
			}
			before := srv.Stats()
			if before.Unauthorized != 0 {
				t.Fatalf("%d requests of the two dispatchers refused 401\na:\n%s\nb:\n%s", before.Unauthorized, tail(a.log.String(), 2000), tail(b.log.String(), 2000))
			}

			// The reasons, without quotes, which a JSON log escapes.
			for _, tt := range []struct {
				name, kid string
				why       []string
			}{
				{"b's key signing for a under b's kid", "key-b", []string{"key-b", "is dispatcher", idB, "signs only for itself"}},
				{"b's key claiming a's kid", "key-a", []string{"key-a", "verif"}},
			} {
				imp := startDispatcherProcess(ctx, t, cfg, ns, flags(keyB, tt.kid, idA)...)
				if err := imp.cmd.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan error, 1)
				go func() { exited <- imp.cmd.Wait() }()
				select {
				case err := <-exited:
					if err == nil {
						t.Errorf("%s: the impersonator exited 0\n%s", tt.name, tail(imp.log.String(), 3000))
					}
				case <-time.After(time.Minute):
					_ = imp.cmd.Process.Kill()
					err := <-exited
					t.Errorf("%s: the impersonator was not refused within a minute (killed: %v)\n%s", tt.name, err, tail(imp.log.String(), 3000))
					continue
				}
				out := imp.log.String()
				for _, w := range append([]string{"refused this dispatcher", "401"}, tt.why...) {
					if !strings.Contains(out, w) {
						t.Errorf("%s: the impersonator's log does not say %q:\n%s", tt.name, w, tail(out, 3000))
					}
				}
			}
			after := srv.Stats()
			if after.Unauthorized == 0 || after.LeasesIssued != before.LeasesIssued {
				t.Errorf("stats %+v after the impersonations, %+v before: want 401s and no lease", after, before)
			}
			for _, p := range srv.Polls() {
				if p.DispatcherID != idA && p.DispatcherID != idB {
					t.Errorf("a poll of %q answered", p.DispatcherID)
				}
			}
			// a still runs as itself.
			more := orchestratorTasks(srv, "after", 2)
			waitAllDone(ctx, t, srv, len(ids)+len(more), 2*time.Minute, a)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/k8s/resources"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/kube"
	"github.com/runwarden/runwarden/e2e/harness"
)

// dispatcherProcess is runwarden-dispatcher running on the host against the
// suite's cluster, watching one namespace.
type dispatcherProcess struct {
	cmd     *exec.Cmd
	log     *harness.LockedBuffer
	bin     string
	args    []string
	health  string
	metrics string
	pprof   string
}

func installCRD(ctx context.Context, t testing.TB, cfg *envconf.Config) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(suite.RepoRoot, "dispatcher", "api", "v1alpha1", "crd", "runwarden.dev_runnertasks.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(b, crd); err != nil {
		t.Fatal(err)
	}
	// The scheme knows both types already (TestMain).
	r := cfg.Client().Resources()
	if err := r.Create(ctx, crd); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("creating the RunnerTask CRD: %v", err)
	}
	established := conditions.New(r).ResourceMatch(crd, func(o k8s.Object) bool {
		for _, c := range o.(*apiextensionsv1.CustomResourceDefinition).Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if err := harness.WaitFor(ctx, "the RunnerTask CRD to be established", 30*time.Second, established); err != nil {
		t.Fatal(err)
	}
}

// startDispatcherProcess builds the dispatcher for namespace ns with a pod
// template that runs on the real node, and prepares (but does not start)
// its process.
func startDispatcherProcess(ctx context.Context, t testing.TB, cfg *envconf.Config, ns string, extra ...string) *dispatcherProcess {
	t.Helper()
	dir := t.TempDir()
	// --source-dir=DIR (not passed on): build the dispatcher from another
	// checkout, for a benchmark to compare two versions in one run.
	src := suite.RepoRoot
	for _, a := range extra {
		if dir, ok := strings.CutPrefix(a, "--source-dir="); ok {
			src = dir
		}
	}
	extra = slices.DeleteFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--source-dir=") })
	d := &dispatcherProcess{log: &harness.LockedBuffer{}, bin: built.build(ctx, t, src, "./dispatcher")}
	image, err := suite.ImageRef(ctx, "runner")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers:                    []corev1.Container{{Name: "main", Image: image, ImagePullPolicy: corev1.PullNever}},
	}}
	simulated := slices.Contains(extra, "--simulated")
	if simulated {
		// Simulated nodes never pull or run the image; kwok completes the pod.
		tmpl.Spec.Containers[0].Image = "busybox:stable"
	} else {
		harness.OnRealNode(&tmpl.Spec)
	}
	extra = slices.DeleteFunc(extra, func(a string) bool { return a == "--simulated" })
	b, err := yaml.Marshal(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	tmplFile := filepath.Join(dir, "template.yaml")
	if err := os.WriteFile(tmplFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	d.health = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d.metrics = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d.args = []string{
		"--dispatcher-id", "e2e-" + ns[len(ns)-6:], "--namespace", ns, "--pod-template", tmplFile,
		"--env-allow", "GREETING,TF_*", "--max-concurrent", "5", "--unschedulable-timeout", "5s",
		"--succeeded-history", "1", "--failed-history", "1",
		"--metrics-bind-address", d.metrics, "--health-probe-bind-address", d.health,
		"--kubeconfig", cfg.KubeconfigFile(), "--preflight-timeout", "90s",
	}
	if os.Getenv("RUNWARDEN_BENCH_CPUPROFILE")+os.Getenv("RUNWARDEN_BENCH_HEAPPROFILE") != "" {
		d.pprof = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		d.args = append(d.args, "--pprof-bind-address", d.pprof)
	}
	d.args = append(d.args, extra...)
	// Replicas keep their Lease outside the runner namespace (the
	// dispatcher refuses it there), as the chart keeps it in its release's.
	if slices.Contains(extra, "--leader-elect") && !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, "--leader-elect-namespace") }) {
		d.args = append(d.args, "--leader-elect-namespace", controlNamespace(ctx, t, cfg, ns))
	}
	d.cmd = d.command()
	return d
}

// controlNamespace is the namespace beside the runner namespace ns where a
// test keeps what the dispatcher must not read from ns (its Lease, its
// Gitea registration, a label's template), as the chart keeps them in its
// release namespace: ns-ctl, made once, deleted when the test that made it
// ends.
func controlNamespace(ctx context.Context, t testing.TB, cfg *envconf.Config, ns string) string {
	t.Helper()
	ctl := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns + "-ctl"}}
	err := cfg.Client().Resources().Create(ctx, ctl)
	switch {
	case err == nil:
		t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), ctl) })
	case !apierrors.IsAlreadyExists(err):
		t.Fatal(err)
	}
	return ctl.Name
}

// startDispatcher builds the dispatcher and starts it, waiting until ready.
func startDispatcher(ctx context.Context, t testing.TB, cfg *envconf.Config, ns string, extra ...string) *dispatcherProcess {
	t.Helper()
	d := startDispatcherProcess(ctx, t, cfg, ns, extra...)
	d.start(ctx, t)
	t.Cleanup(func() { d.stop(os.Interrupt) })
	return d
}

// command is d's process, not started, its output going to d.log.
func (d *dispatcherProcess) command() *exec.Cmd {
	cmd := exec.Command(d.bin, d.args...)
	cmd.Stdout, cmd.Stderr = d.log, d.log
	return cmd
}

// launch starts d's process.
func (d *dispatcherProcess) launch() error {
	d.cmd = d.command()
	return d.cmd.Start()
}

// start starts d and waits until it is ready (with --leader-elect: leads).
func (d *dispatcherProcess) start(ctx context.Context, t testing.TB) {
	t.Helper()
	if err := d.launch(); err != nil {
		t.Fatal(err)
	}
	if err := harness.WaitFor(ctx, "the dispatcher to be ready", 2*time.Minute, d.answers("/readyz")); err != nil {
		t.Fatalf("%v\n%s", err, d.log.String())
	}
}

func (d *dispatcherProcess) stop(sig os.Signal) {
	if d.cmd != nil && d.cmd.Process != nil && d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Signal(sig)
		_, _ = d.cmd.Process.Wait()
	}
}

func runnerTask(ns, name string, script string) *v1alpha1.RunnerTask {
	return &v1alpha1.RunnerTask{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.RunnerTaskSpec{
			Command: []string{"/bin/sh", "-c", script},
			Env:     []corev1.EnvVar{{Name: "GREETING", Value: "hello"}},
		},
	}
}

// waitPhase waits for a RunnerTask to reach a final phase and returns it.
func waitPhase(ctx context.Context, t *testing.T, cfg *envconf.Config, rt *v1alpha1.RunnerTask, d *dispatcherProcess) *v1alpha1.RunnerTask {
	t.Helper()
	r := cfg.Client().Resources(rt.Namespace)
	done := conditions.New(r).ResourceMatch(rt, func(o k8s.Object) bool {
		return terminalPhase(o.(*v1alpha1.RunnerTask).Status.Phase)
	})
	if err := harness.WaitFor(ctx, "RunnerTask "+rt.Name+" to finish", 2*time.Minute, done); err != nil {
		t.Fatalf("%v\ndispatcher log:\n%s", err, d.log.String())
	}
	got := &v1alpha1.RunnerTask{}
	if err := r.Get(ctx, rt.Name, rt.Namespace, got); err != nil {
		t.Fatal(err)
	}
	return got
}

func jobsOf(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string) []batchv1.Job {
	t.Helper()
	var jobs batchv1.JobList
	if err := cfg.Client().Resources(ns).List(ctx, &jobs); err != nil {
		t.Fatal(err)
	}
	return jobs.Items
}

// TestDispatcherPreflightNamesTheCause starts the dispatcher against a
// namespace whose Pod Security level refuses its runner pods: it exits
// non-zero and says why, before taking any task.
func TestDispatcherPreflightNamesTheCause(t *testing.T) {
	t.Parallel()
	f := features.New("dispatcher preflight").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("a restricted namespace fails the preflight", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			if err := harness.LabelNamespace(ctx, cfg, "pod-security.kubernetes.io/enforce", "restricted"); err != nil {
				t.Fatal(err)
			}
			// The preflight's own timeout (2m), as the chart runs it, not
			// the suite's 90s: the refusal reaches the dispatcher as the Job
			// controller's FailedCreate event, which under the whole suite's
			// load on two cores came after 25.6 s once and after 30 s once.
			d := startDispatcherProcess(ctx, t, cfg, ns, "--preflight-timeout=2m")
			err := d.cmd.Run()
			if err == nil {
				t.Fatalf("the dispatcher started in a namespace that refuses its pods:\n%s", d.log.String())
			}
			for _, w := range []string{"preflight failed", "not admitted", "PodSecurity"} {
				if !strings.Contains(d.log.String(), w) {
					t.Errorf("the dispatcher's error does not say %q:\n%s", w, d.log.String())
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestDispatcherRunsRunnerTasks submits RunnerTasks and checks each runs as
// exactly one Job whose outcome lands in the task's status.
func TestDispatcherRunsRunnerTasks(t *testing.T) {
	t.Parallel()
	f := features.New("dispatcher runs RunnerTasks").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("success, failure with exit code, refusal, cancellation, restart", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			d := startDispatcher(ctx, t, cfg, ns)

			ok := runnerTask(ns, "ok", `echo "$GREETING from the runner"`)
			if err := r.Create(ctx, ok); err != nil {
				t.Fatal(err)
			}
			got := waitPhase(ctx, t, cfg, ok, d)
			if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.ExitCode == nil || *got.Status.ExitCode != 0 || got.Status.JobName == "" {
				t.Errorf("task ok: status %+v", got.Status)
			}
			logs, err := suite.Kubectl(ctx, cfg, "logs", "-n", ns, "job/"+got.Status.JobName)
			if err != nil || logs != "hello from the runner\n" {
				t.Errorf("task ok logs %q, %v", logs, err)
			}
			// The log outlives the Job: kept in the ConfigMap the status
			// names, which the RunnerTask owns.
			if err := r.Delete(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: got.Status.JobName, Namespace: ns}}, resources.WithDeletePropagation("Background")); err != nil {
				t.Fatal(err)
			}
			kept, err := suite.Kubectl(ctx, cfg, "get", "configmap", "-n", ns, got.Status.LogConfigMap, "-o", "jsonpath={.data.log}")
			if err != nil || kept != "hello from the runner\n" || !strings.HasPrefix(got.Status.LogConfigMap, kube.LogConfigMapPrefix(got.Status.JobName)) {
				t.Errorf("task ok's kept log (ConfigMap %q): %q, %v", got.Status.LogConfigMap, kept, err)
			}

			bad := runnerTask(ns, "exit-3", `echo failing; exit 3`)
			if err := r.Create(ctx, bad); err != nil {
				t.Fatal(err)
			}
			got = waitPhase(ctx, t, cfg, bad, d)
			if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "NonZeroExit" || got.Status.ExitCode == nil || *got.Status.ExitCode != 3 {
				t.Errorf("task exit-3: status %+v", got.Status)
			}

			huge := runnerTask(ns, "too-big", "true")
			huge.Spec.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}}
			if err := r.Create(ctx, huge); err != nil {
				t.Fatal(err)
			}
			got = waitPhase(ctx, t, cfg, huge, d)
			if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "Unschedulable" || !strings.Contains(got.Status.Message, "Insufficient cpu") {
				t.Errorf("task too-big: status %+v", got.Status)
			}

			refused := runnerTask(ns, "refused", "true")
			refused.Spec.Env = append(refused.Spec.Env, corev1.EnvVar{Name: "AWS_SECRET_ACCESS_KEY", Value: "x"})
			if err := r.Create(ctx, refused); err != nil {
				t.Fatal(err)
			}
			got = waitPhase(ctx, t, cfg, refused, d)
			if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "Refused" || !strings.Contains(got.Status.Message, "AWS_SECRET_ACCESS_KEY") || got.Status.JobName != "" {
				t.Errorf("task refused: status %+v", got.Status)
			}

			long := runnerTask(ns, "cancel-me", `sleep 300`)
			lost := runnerTask(ns, "job-deleted", `sleep 300`)
			ended := runnerTask(ns, "ends-while-down", `sleep 8`)
			for _, rt := range []*v1alpha1.RunnerTask{ended, long, lost} {
				if err := r.Create(ctx, rt); err != nil {
					t.Fatal(err)
				}
				started := conditions.New(r).ResourceMatch(rt, func(o k8s.Object) bool {
					return o.(*v1alpha1.RunnerTask).Status.JobName != ""
				})
				if err := harness.WaitFor(ctx, "task "+rt.Name+" to get a Job", time.Minute, started); err != nil {
					t.Fatal(err)
				}
			}
			// Restart the dispatcher hard while the tasks run: the Job is the
			// record, and the new process carries on with it. A Job deleted
			// meanwhile fails its task; it is never created a second time.
			// A task whose Job ends while the dispatcher is down, and that is
			// cancelled before it is back, keeps its real outcome.
			d.stop(os.Kill)
			if err := r.Get(ctx, lost.Name, ns, lost); err != nil {
				t.Fatal(err)
			}
			if _, err := suite.Kubectl(ctx, cfg, "delete", "job", "-n", ns, lost.Status.JobName, "--wait=true"); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, ended.Name, ns, ended); err != nil {
				t.Fatal(err)
			}
			if terminalPhase(ended.Status.Phase) {
				t.Fatalf("task %s ended before the dispatcher stopped (status %+v): the check below needs a longer task", ended.Name, ended.Status)
			}
			endedJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: ended.Status.JobName, Namespace: ns}}
			complete := conditions.New(r).JobConditionMatch(endedJob, batchv1.JobComplete, corev1.ConditionTrue)
			if err := harness.WaitFor(ctx, "the Job of "+ended.Name+" to complete", time.Minute, complete); err != nil {
				t.Fatal(err)
			}
			cancelRunnerTask(ctx, t, cfg, ns, ended.Name)
			d.start(ctx, t)
			cancelRunnerTask(ctx, t, cfg, ns, long.Name)
			got = waitPhase(ctx, t, cfg, long, d)
			if got.Status.Phase != v1alpha1.PhaseCancelled {
				t.Errorf("task cancel-me: status %+v", got.Status)
			}
			got = waitPhase(ctx, t, cfg, ended, d)
			if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.Reason != "Completed" {
				t.Errorf("task %s, cancelled after its Job completed: status %+v, want Succeeded", ended.Name, got.Status)
			}
			got = waitPhase(ctx, t, cfg, lost, d)
			if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "Failed" || !strings.Contains(got.Status.Message, "deleted before it finished") {
				t.Errorf("task job-deleted: status %+v", got.Status)
			}
			for _, j := range jobsOf(ctx, t, cfg, ns) {
				if j.Name == lost.Status.JobName {
					t.Errorf("task job-deleted got a second Job %s", j.Name)
				}
			}

			// History: one succeeded Job is kept; a second success removes the first's.
			ok2 := runnerTask(ns, "ok-2", `echo again`)
			if err := r.Create(ctx, ok2); err != nil {
				t.Fatal(err)
			}
			if got := waitPhase(ctx, t, cfg, ok2, d); got.Status.Phase != v1alpha1.PhaseSucceeded {
				t.Errorf("task ok-2: status %+v", got.Status)
			}
			pruned := func(ctx context.Context) (bool, error) {
				complete := 0
				for _, j := range jobsOf(ctx, t, cfg, ns) {
					for _, c := range j.Status.Conditions {
						if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue && j.DeletionTimestamp == nil {
							complete++
						}
					}
				}
				return complete == 1, nil
			}
			if err := harness.WaitFor(ctx, "one succeeded Job to be kept", 30*time.Second, pruned); err != nil {
				t.Error(err)
			}

			// Exactly one Job per task that got one.
			byTask := map[string]int{}
			for _, j := range jobsOf(ctx, t, cfg, ns) {
				byTask[j.Annotations["runwarden.dev/task-id"]]++
			}
			for id, n := range byTask {
				if n != 1 {
					t.Errorf("task %s has %d Jobs, want 1", id, n)
				}
			}
			resp, err := http.Get("http://" + d.metrics + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			// The second process counts only what it saw: the cancellation, the deleted Job, the task that
			// ended while it was down, and ok-2.
			for _, w := range []string{`runwarden_dispatcher_tasks_finished_total{phase="Succeeded",reason="Completed"} 2`, `runwarden_dispatcher_tasks_finished_total{phase="Cancelled",reason="Cancelled"} 1`, `runwarden_dispatcher_tasks_finished_total{phase="Failed",reason="Failed"} 1`, "runwarden_dispatcher_capacity 5"} {
				if !strings.Contains(string(body), w) {
					t.Errorf("metrics lack %q", w)
				}
			}

			out, err := suite.Kubectl(ctx, cfg, "get", "runnertasks", "-n", ns)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{"PHASE", "JOB", "REASON", "EXIT", "Succeeded", "NonZeroExit", "Unschedulable", "Refused", "Cancelled"} {
				if !strings.Contains(out, w) {
					t.Errorf("kubectl get runnertasks lacks %q:\n%s", w, out)
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestDispatcherSurvivesSIGKILL runs 200 tasks through two replicas with
// --leader-elect while the leader is killed with SIGKILL at random moments,
// ten times, and the standby takes over: every task ends with exactly one
// Job and one final status, and never more than --max-concurrent run.
func TestDispatcherSurvivesSIGKILL(t *testing.T) {
	// Beside other tests: electionFlags.
	t.Parallel()
	const tasks, kills = 200, 10
	f := features.New("dispatcher survives SIGKILL").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("200 tasks, two replicas, the leader killed 10 times, one Job each", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			rs := startReplicas(ctx, t, cfg, ns, 2, append([]string{"--simulated", "--max-concurrent", "40",
				"--succeeded-history", "1000", "--failed-history", "1000", "--preflight=false"}, electionFlags...)...)
			watch := harness.WatchJobs(ctx, t, cfg, ns, 40)
			rng := rand.New(rand.NewPCG(7, 11))
			// Tasks keep arriving across the kills.
			for k := range kills {
				for i := k * tasks / kills; i < (k+1)*tasks/kills; i++ {
					if err := r.Create(ctx, runnerTask(ns, fmt.Sprintf("task-%03d", i), "true")); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
				rs.killLeader(ctx, t)
			}
			all := func(ctx context.Context) (bool, error) {
				var list v1alpha1.RunnerTaskList
				if err := r.List(ctx, &list); err != nil {
					return false, err
				}
				done := 0
				for _, rt := range list.Items {
					if terminalPhase(rt.Status.Phase) {
						done++
					}
				}
				return done == tasks, nil
			}
			if err := harness.WaitFor(ctx, "all 200 tasks to finish", 5*time.Minute, all); err != nil {
				t.Fatalf("%v\n%s", err, rs.logs())
			}
			var list v1alpha1.RunnerTaskList
			if err := r.List(ctx, &list); err != nil {
				t.Fatal(err)
			}
			jobs := map[string]int{}
			for _, j := range jobsOf(ctx, t, cfg, ns) {
				jobs[j.Annotations["runwarden.dev/task-id"]]++
			}
			for _, rt := range list.Items {
				id := rt.Namespace + "/" + rt.Name + "/" + string(rt.UID)
				if jobs[id] != 1 || rt.Status.Phase != v1alpha1.PhaseSucceeded || rt.Status.JobName == "" {
					t.Errorf("task %s: %d Jobs, status %+v", rt.Name, jobs[id], rt.Status)
				}
			}
			if len(jobs) != tasks {
				t.Errorf("%d tasks have Jobs, want %d", len(jobs), tasks)
			}
			// Each Job gets its TTL once its task's status holds the
			// outcome, also when a kill fell between the two.
			settled := func(ctx context.Context) (bool, error) {
				for _, j := range jobsOf(ctx, t, cfg, ns) {
					if j.Annotations["runwarden.dev/reported"] != "true" || j.Spec.TTLSecondsAfterFinished == nil {
						return false, nil
					}
				}
				return true, nil
			}
			if err := harness.WaitFor(ctx, "every Job to be marked reported, with its TTL", time.Minute, settled); err != nil {
				t.Error(err)
			}
			watch.Check(ctx, t)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

func terminalPhase(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhaseSucceeded || p == v1alpha1.PhaseFailed || p == v1alpha1.PhaseCancelled
}

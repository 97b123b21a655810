//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/e2e/harness"
)

// The contract both task sources keep: the same tasks, run on the real
// node, end the same way, each with exactly one Job (none when refused)
// shaped the same way.

// contractCase is one task of the contract and how it must end.
type contractCase struct {
	name      string
	script    string
	env       []corev1.EnvVar
	deadline  *int64
	resources *corev1.ResourceRequirements
	cancel    bool
	want      contractOutcome
}

// contractOutcome is a task's final status, whatever the source.
type contractOutcome struct {
	phase, reason string
	exit          *int32
	message       string
}

// taskDriver submits contract tasks to one source and reads their ends.
type taskDriver interface {
	// submit hands a task to the source and returns its task ID (the
	// Job's runwarden.dev/task-id annotation).
	submit(ctx context.Context, t *testing.T, c contractCase) string
	cancel(ctx context.Context, t *testing.T, c contractCase)
	// result is the final status, once there is one.
	result(ctx context.Context, t *testing.T, c contractCase) (contractOutcome, bool)
}

var contractCases = []contractCase{
	{
		name: "ok", script: `echo "$GREETING from the runner"`,
		env: []corev1.EnvVar{
			{Name: "GREETING", Value: "hello"},
			{Name: "TF_VAR_db_password", Value: "${vault:secret/db.password@team-a}"},
		},
		want: contractOutcome{phase: "Succeeded", reason: "Completed", exit: ptr.To[int32](0)},
	},
	{
		name: "exit-3", script: "echo failing; exit 3",
		want: contractOutcome{phase: "Failed", reason: "NonZeroExit", exit: ptr.To[int32](3)},
	},
	{
		name: "refused", script: "true", env: []corev1.EnvVar{{Name: "AWS_SECRET_ACCESS_KEY", Value: "x"}},
		want: contractOutcome{phase: "Failed", reason: "Refused", message: "AWS_SECRET_ACCESS_KEY"},
	},
	{
		name: "too-big", script: "true",
		resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}},
		want:      contractOutcome{phase: "Failed", reason: "Unschedulable", message: "Insufficient cpu"},
	},
	{
		// Build takes it; the API server refuses the Job (requests above
		// limits): refused at once, not retried forever.
		name: "invalid", script: "true",
		resources: &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
		},
		want: contractOutcome{phase: "Failed", reason: "Refused", message: "must be less than or equal to cpu limit"},
	},
	{
		name: "deadline", script: "sleep 60", deadline: ptr.To[int64](3),
		want: contractOutcome{phase: "Failed", reason: "DeadlineExceeded"},
	},
	{
		name: "cancel", script: "sleep 300", cancel: true,
		want: contractOutcome{phase: "Cancelled", reason: "Cancelled"},
	},
}

// runContract submits every case, cancels the cancel case once its Job
// exists, and checks every outcome and every Job.
func runContract(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, d taskDriver, dp *dispatcherProcess) {
	t.Helper()
	ids := map[string]string{}
	for _, c := range contractCases {
		ids[c.name] = d.submit(ctx, t, c)
	}
	for _, c := range contractCases {
		if !c.cancel {
			continue
		}
		hasJob := func(ctx context.Context) (bool, error) {
			return len(jobsFor(ctx, t, cfg, ns, ids[c.name])) == 1, nil
		}
		if err := harness.WaitFor(ctx, "task "+c.name+" to get a Job", time.Minute, hasJob); err != nil {
			t.Fatalf("%v\n%s", err, dp.log.String())
		}
		d.cancel(ctx, t, c)
	}
	for _, c := range contractCases {
		var got contractOutcome
		done := func(ctx context.Context) (bool, error) {
			var ok bool
			got, ok = d.result(ctx, t, c)
			return ok, nil
		}
		if err := harness.WaitFor(ctx, "task "+c.name+" to finish", 2*time.Minute, done); err != nil {
			t.Errorf("%v\ndispatcher log:\n%s", err, dp.log.String())
			continue
		}
		if got.phase != c.want.phase || got.reason != c.want.reason ||
			(c.want.exit != nil && (got.exit == nil || *got.exit != *c.want.exit)) ||
			!strings.Contains(got.message, c.want.message) {
			t.Errorf("task %s ended %+v (exit %v), want %+v (exit %v)", c.name, got, deref(got.exit), c.want, deref(c.want.exit))
		}
		jobs := jobsFor(ctx, t, cfg, ns, ids[c.name])
		wantJobs := 1
		if c.want.reason == "Refused" {
			wantJobs = 0
		}
		if c.cancel || c.want.reason == "Unschedulable" {
			// A task stopped before its Job ended has its Job removed with
			// its pod; never more than one.
			wantJobs = len(jobs)
		}
		if len(jobs) != wantJobs || len(jobs) > 1 {
			t.Errorf("task %s has %d Jobs, want %d", c.name, len(jobs), wantJobs)
			continue
		}
		for _, j := range jobs {
			if j.Spec.TTLSecondsAfterFinished == nil {
				// Both sources set the TTL when they mark the Job
				// reported, right after the source holds the outcome.
				j = settledJob(ctx, t, cfg, j)
			}
			checkRunnerJob(t, c, &j)
		}
	}
}

func deref(p *int32) any {
	if p == nil {
		return nil
	}
	return *p
}

// settledJob waits until the dispatcher marked a Job reported and returns
// it then.
func settledJob(ctx context.Context, t *testing.T, cfg *envconf.Config, j batchv1.Job) batchv1.Job {
	t.Helper()
	got := j
	marked := func(ctx context.Context) (bool, error) {
		if err := cfg.Client().Resources(j.Namespace).Get(ctx, j.Name, j.Namespace, &got); err != nil {
			return false, nil
		}
		return got.Annotations["runwarden.dev/reported"] == "true", nil
	}
	if err := harness.WaitFor(ctx, "Job "+j.Name+" to be marked reported", 30*time.Second, marked); err != nil {
		t.Error(err)
	}
	return got
}

// jobsFor lists the Jobs of one task ID.
func jobsFor(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, id string) []batchv1.Job {
	var out []batchv1.Job
	for _, j := range jobsOf(ctx, t, cfg, ns) {
		if j.Annotations["runwarden.dev/task-id"] == id && j.DeletionTimestamp == nil {
			out = append(out, j)
		}
	}
	return out
}

// checkRunnerJob checks the shape every source's Jobs share.
func checkRunnerJob(t *testing.T, c contractCase, j *batchv1.Job) {
	t.Helper()
	s := j.Spec
	if ptr.Deref(s.BackoffLimit, -1) != 0 || s.PodReplacementPolicy == nil || *s.PodReplacementPolicy != batchv1.Failed ||
		s.Template.Spec.RestartPolicy != corev1.RestartPolicyNever || s.TTLSecondsAfterFinished == nil || s.ActiveDeadlineSeconds == nil {
		t.Errorf("task %s: Job %s spec %+v", c.name, j.Name, s)
	}
	if c.deadline != nil && *s.ActiveDeadlineSeconds != *c.deadline {
		t.Errorf("task %s: activeDeadlineSeconds %d, want %d", c.name, *s.ActiveDeadlineSeconds, *c.deadline)
	}
	if j.Labels["runwarden.dev/dispatcher"] == "" || j.Labels["runwarden.dev/task-id"] == "" || s.Template.Labels["runwarden.dev/runner"] != "true" {
		t.Errorf("task %s: Job labels %v, pod labels %v", c.name, j.Labels, s.Template.Labels)
	}
	var main *corev1.Container
	for i := range s.Template.Spec.Containers {
		if s.Template.Spec.Containers[i].Name == "main" {
			main = &s.Template.Spec.Containers[i]
		}
	}
	if main == nil {
		t.Fatalf("task %s: no main container", c.name)
	}
	for _, e := range c.env {
		if !slices.ContainsFunc(main.Env, func(got corev1.EnvVar) bool { return got.Name == e.Name && got.Value == e.Value }) {
			t.Errorf("task %s: env %s=%q not passed through untouched: %v", c.name, e.Name, e.Value, main.Env)
		}
	}
}

// cancelRunnerTask sets spec.cancel with a merge patch: the dispatcher
// writes the status meanwhile, so an update of the whole object could
// conflict.
func cancelRunnerTask(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, name string) {
	t.Helper()
	rt := &v1alpha1.RunnerTask{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	patch := k8s.Patch{PatchType: types.MergePatchType, Data: []byte(`{"spec":{"cancel":true}}`)}
	if err := cfg.Client().Resources(ns).Patch(ctx, rt, patch); err != nil {
		t.Fatal(err)
	}
}

// kubeDriver is the kube source: RunnerTask objects.
type kubeDriver struct {
	cfg *envconf.Config
	ns  string
}

func (k kubeDriver) submit(ctx context.Context, t *testing.T, c contractCase) string {
	rt := runnerTask(k.ns, c.name, c.script)
	rt.Spec.Env = c.env
	rt.Spec.ActiveDeadlineSeconds = c.deadline
	rt.Spec.Resources = c.resources
	if err := k.cfg.Client().Resources(k.ns).Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	return rt.Namespace + "/" + rt.Name + "/" + string(rt.UID)
}

func (k kubeDriver) cancel(ctx context.Context, t *testing.T, c contractCase) {
	cancelRunnerTask(ctx, t, k.cfg, k.ns, c.name)
}

func (k kubeDriver) result(ctx context.Context, t *testing.T, c contractCase) (contractOutcome, bool) {
	rt := &v1alpha1.RunnerTask{}
	if err := k.cfg.Client().Resources(k.ns).Get(ctx, c.name, k.ns, rt); err != nil {
		t.Fatal(err)
	}
	st := rt.Status
	return contractOutcome{phase: string(st.Phase), reason: st.Reason, exit: st.ExitCode, message: st.Message}, terminalPhase(st.Phase)
}

// orchestratorDriver is the orchestrator source, fed by the fake
// orchestrator.
type orchestratorDriver struct {
	srv *orchestratortest.Server
}

func (o orchestratorDriver) submit(_ context.Context, _ *testing.T, c contractCase) string {
	task := orchestrator.Task{ID: c.name, Command: []string{"/bin/sh", "-c", c.script}, ActiveDeadlineSeconds: c.deadline, Resources: wireResources(c.resources)}
	for _, e := range c.env {
		task.Env = append(task.Env, orchestrator.EnvVar{Name: e.Name, Value: e.Value})
	}
	o.srv.Add(task)
	return c.name
}

// wireResources are a case's resources as the protocol carries them.
func wireResources(r *corev1.ResourceRequirements) *orchestrator.Resources {
	if r == nil {
		return nil
	}
	w := &orchestrator.Resources{}
	list := func(l corev1.ResourceList) map[string]orchestrator.Quantity {
		if l == nil {
			return nil
		}
		m := map[string]orchestrator.Quantity{}
		for name, q := range l {
			m[string(name)] = orchestrator.Quantity(q.String())
		}
		return m
	}
	w.Limits, w.Requests = list(r.Limits), list(r.Requests)
	for _, c := range r.Claims {
		w.Claims = append(w.Claims, orchestrator.ResourceClaim{Name: c.Name, Request: c.Request})
	}
	return w
}

func (o orchestratorDriver) cancel(_ context.Context, _ *testing.T, c contractCase) {
	o.srv.Cancel(c.name, "cancelled by the e2e suite")
}

var eventPhases = map[orchestrator.EventType]string{
	orchestrator.EventSucceeded: "Succeeded", orchestrator.EventFailed: "Failed", orchestrator.EventCancelled: "Cancelled",
}

func (o orchestratorDriver) result(_ context.Context, _ *testing.T, c contractCase) (contractOutcome, bool) {
	rec := o.srv.Task(c.name)
	if rec.Final == nil {
		return contractOutcome{}, false
	}
	f := rec.Final
	return contractOutcome{phase: eventPhases[f.Type], reason: f.Reason, exit: f.ExitCode, message: f.Message}, true
}

// TestTaskSourceContract runs the contract against both sources.
func TestTaskSourceContract(t *testing.T) {
	t.Parallel()
	kube := features.New("contract: kube source").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("every case ends as the contract says", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			d := startDispatcher(ctx, t, cfg, ns, "--preflight=false", "--failed-history", "10", "--succeeded-history", "10")
			runContract(ctx, t, cfg, ns, kubeDriver{cfg: cfg, ns: ns}, d)
			return ctx
		}).Feature()
	orch := features.New("contract: orchestrator source").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			return ctx
		}).
		Assess("every case ends as the contract says", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 30})
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--preflight=false", "--failed-history", "10", "--succeeded-history", "10")
			runContract(ctx, t, cfg, ns, orchestratorDriver{srv: o.srv}, d)
			checkOrchestratorRecords(ctx, t, cfg, ns, o.srv)
			return ctx
		}).Feature()
	testenv.Test(t, kube, orch)
}

// checkOrchestratorRecords checks what the orchestrator was told beyond
// the outcomes: events in order, each once, and the runner's log.
func checkOrchestratorRecords(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, srv *orchestratortest.Server) {
	t.Helper()
	for _, c := range contractCases {
		rec := srv.Task(c.name)
		var types []string
		for _, e := range rec.Events {
			types = append(types, string(e.Type))
		}
		if rec.FinalStored != 1 || rec.BadKeys != 0 {
			t.Errorf("task %s: %d final events stored, %d bad keys", c.name, rec.FinalStored, rec.BadKeys)
		}
		if c.want.reason == "Refused" {
			if fmt.Sprint(types) != "[failed]" {
				t.Errorf("task %s: events %v, want [failed]", c.name, types)
			}
			continue
		}
		if len(types) < 2 || types[0] != "job-created" || !orchestrator.EventType(types[len(types)-1]).Final() {
			t.Errorf("task %s: events %v, want job-created first and a final event last", c.name, types)
		}
	}
	ok := srv.Task("ok")
	if string(ok.Log) != "hello from the runner\n" || !ok.LogFinal {
		t.Errorf("task ok: log %q (final %v), want the runner's output", ok.Log, ok.LogFinal)
	}
	failing := srv.Task("exit-3")
	if string(failing.Log) != "failing\n" {
		t.Errorf("task exit-3: log %q", failing.Log)
	}
	// The runner pod of the ok task really ran where the Job said.
	for _, j := range jobsFor(ctx, t, cfg, ns, "ok") {
		if ok.Final == nil || ok.Final.JobName != j.Name {
			t.Errorf("task ok: final event names Job %v, the Job is %s", ok.Final, j.Name)
		}
	}
}

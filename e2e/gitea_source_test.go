//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	mathrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/gitea"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/e2e/harness"
)

// The workflows TestGiteaSource pushes, in one commit: each starts one run.
var giteaWorkflows = map[string]string{
	// Checks out the commit, runs OpenTofu from the runner image, passes an
	// output between steps, fails a step: the step after it is skipped,
	// the always() one runs and sees the earlier output.
	".gitea/workflows/deploy.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  deploy:
    runs-on: tofu
    env:
      KEY_SHA: ${{ secrets.DEPLOY_KEY }}
    steps:
      - uses: actions/checkout@v4
      - id: plan
        name: plan
        run: |
          head -1 main.tf
          echo "first=$(head -1 main.tf)" >> "$GITHUB_OUTPUT"
          printf %s "$KEY_SHA" | sha256sum | cut -c1-16 | sed 's/^/key sha /'
      - name: tofu
        run: tofu version
      - name: fails
        run: exit 3
      - name: never
        run: echo this step never runs
      - name: cleanup
        if: always()
        run: echo "cleanup after ${{ steps.plan.outputs.first }}"
`,
	// Its job-level if: is false: skipped, no pod.
	".gitea/workflows/skip.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  nightly:
    runs-on: tofu
    if: github.event_name == 'schedule'
    steps:
      - run: echo never
`,
	// An action runwarden does not run: refused, no pod.
	".gitea/workflows/action.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  build:
    runs-on: tofu
    steps:
      - uses: actions/setup-go@v5
`,
	// Runs with the PodTemplate of its label.
	".gitea/workflows/small.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  small:
    runs-on: small
    steps:
      - run: echo "template $RW_TEMPLATE"
`,
	// Its label's template selects a node no node is: unschedulable past
	// --unschedulable-timeout, the Job deleted.
	".gitea/workflows/nowhere.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  nowhere:
    runs-on: nowhere
    steps:
      - run: echo never
`,
	// Cancelled from its page in Gitea while it runs: its Job goes.
	".gitea/workflows/cancelme.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  cancelme:
    runs-on: tofu
    steps:
      - run: echo started; sleep 600
`,
	// Runs past its timeout-minutes: the Job's deadline ends it.
	".gitea/workflows/slow.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  slow:
    runs-on: tofu
    timeout-minutes: 1
    steps:
      - run: sleep 600
`,
	// Its image is not on the node (and the template never pulls).
	".gitea/workflows/noimage.yml": `on:
  push:
    paths: ['main.tf']
jobs:
  noimage:
    runs-on: tofu
    container:
      image: localhost/runwarden/absent:v1
    steps:
      - run: echo never
`,
	// Runs until the next push to long/ cancels it (concurrency).
	".gitea/workflows/long.yml": `on:
  push:
    paths: ['long/**']
concurrency:
  group: long
  cancel-in-progress: true
jobs:
  long:
    runs-on: tofu
    steps:
      - uses: actions/checkout@v4
      - name: wait
        run: if [ -f long/second ]; then echo second; else echo waiting; sleep 600; fi
`,
	// Counts while the dispatcher is killed and started again.
	".gitea/workflows/restart.yml": `on:
  push:
    paths: ['restart/**']
jobs:
  restart:
    runs-on: tofu
    steps:
      - name: count
        run: for i in $(seq 1 20); do echo "line $i"; sleep 0.5; done
      - name: after
        run: echo after the count
`,
	"main.tf":    "# runwarden e2e\nterraform {}\n",
	"long/first": "1\n",
}

// TestGiteaSource runs Gitea Actions jobs through the dispatcher as a Gitea
// runner, on the real node, against a real Gitea: each job's result, steps
// and log as Gitea's REST API shows them, and the Jobs in the cluster.
func TestGiteaSource(t *testing.T) {
	t.Parallel()
	f := features.New("gitea source").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			if err := suite.LoadImages(ctx, "runner", "dispatcher"); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("jobs run, fail, skip, are refused and cancelled as Gitea shows them", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			// The feature's context goes on to its teardown uncancelled.
			parent := ctx
			ctx, cancel := context.WithTimeout(ctx, 14*time.Minute)
			defer cancel()
			g := harness.StartGitea(ctx, t, suite.RepoRoot, realNodeGateway)
			if err := g.CreateRepo(ctx, "infra"); err != nil {
				t.Fatal(err)
			}
			if err := g.SetSecret(ctx, "infra", "DEPLOY_KEY", "s3cret-"+ns); err != nil {
				t.Fatal(err)
			}
			d := startGiteaDispatcher(ctx, t, cfg, ns, g)
			// The cap (--max-concurrent 5) and one Job's pods per task,
			// throughout, the restart included.
			watch := harness.WatchJobs(ctx, t, cfg, ns, 5)
			if err := g.PutFiles(ctx, "infra", giteaWorkflows); err != nil {
				t.Fatal(err)
			}

			jobs := waitGiteaJobs(ctx, t, g, "infra", d, map[string]string{
				"deploy": "completed", "nightly": "completed", "build": "completed", "long": "in_progress",
				"slow": "completed", "noimage": "completed", "small": "completed", "nowhere": "completed", "cancelme": "in_progress",
			})
			// cancelme, cancelled in Gitea while its step runs: Gitea shows
			// it cancelled, and its Job goes.
			if err := harness.WaitFor(ctx, "cancelme's step to start", 2*time.Minute, func(ctx context.Context) (bool, error) {
				log, err := g.Log(ctx, "infra", jobs["cancelme"].ID)
				return err == nil && strings.Contains(log, "started"), nil
			}); err != nil {
				t.Fatalf("%v\n%s", err, d.log.String())
			}
			if err := g.CancelRun(ctx, "infra", jobs["cancelme"].RunID); err != nil {
				t.Fatal(err)
			}
			// (Its Job's going is in the count of Jobs below.)
			err := harness.WaitFor(ctx, "cancelme cancelled at Gitea", 2*time.Minute, func(ctx context.Context) (bool, error) {
				all, err := g.Jobs(ctx, "infra")
				if err != nil {
					return false, err
				}
				for _, j := range all {
					if j.ID == jobs["cancelme"].ID {
						return j.Status == "completed" && j.Conclusion == "cancelled", nil
					}
				}
				return false, nil
			})
			if err != nil {
				t.Errorf("%v\n%s", err, d.log.String())
			}
			deploy, skip, action := jobs["deploy"], jobs["nightly"], jobs["build"]
			if deploy.Conclusion != "failure" {
				t.Errorf("deploy: %s, want failure (a step exits 3)", deploy.Conclusion)
			}
			want := []string{"success", "success", "success", "failure", "skipped", "success"}
			if got, err := g.StepStatuses(ctx, "infra", deploy.RunID, deploy.ID); err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("deploy's steps: %v (%v), want %v", got, err, want)
			}
			log, err := g.Log(ctx, "infra", deploy.ID)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("deploy's log at Gitea:\n%s", log)
			for _, w := range []string{"# runwarden e2e", "OpenTofu v", "cleanup after # runwarden e2e", "key sha " + sha16("s3cret-"+ns),
				// The record: the pod and node, and the images the node ran.
				"runwarden: record: pod rw-gitea-", "on node rw-real-0", "runwarden: record: container runwarden-steps ran ", "runwarden: record: container main ran "} {
				if !strings.Contains(log, w) {
					t.Errorf("deploy's log lacks %q:\n%s", w, log)
				}
			}
			for _, w := range []string{"s3cret-" + ns, "this step never runs", "::runwarden-"} {
				if strings.Contains(log, w) {
					t.Errorf("deploy's log holds %q:\n%s", w, log)
				}
			}
			if skip.Conclusion != "skipped" {
				t.Errorf("nightly: %s, want skipped (its if: is false)", skip.Conclusion)
			}
			if action.Conclusion != "failure" {
				t.Errorf("build: %s, want failure (refused)", action.Conclusion)
			}
			if log, err := g.Log(ctx, "infra", action.ID); err != nil || !strings.Contains(log, "uses: actions/setup-go@v5: actions are not supported") {
				t.Errorf("build's log does not say why it was refused (%v):\n%s", err, log)
			}

			if log, err := g.Log(ctx, "infra", jobs["small"].ID); jobs["small"].Conclusion != "success" || err != nil || !strings.Contains(log, "template small") {
				t.Errorf("small: %s, want success with its label's template (%v):\n%s", jobs["small"].Conclusion, err, log)
			}
			for name, reason := range map[string]string{"slow": "runwarden: DeadlineExceeded", "noimage": "runwarden: ImagePullError", "nowhere": "runwarden: Unschedulable"} {
				j := jobs[name]
				log, err := g.Log(ctx, "infra", j.ID)
				if j.Conclusion != "failure" || err != nil || !strings.Contains(log, reason) {
					t.Errorf("%s: %s, want failure with %q in its log (%v):\n%s", name, j.Conclusion, reason, err, log)
				}
			}

			// One Job each for deploy, slow and long, none for the skipped and
			// the refused job, noimage's and nowhere's deleted (their pods
			// never start), cancelme's deleted (cancelled);
			// deploy's and slow's reported, long's not.
			// The mark follows Gitea's answer to the result.
			var list batchv1.JobList
			err = harness.WaitFor(ctx, "deploy's, slow's and small's Jobs marked reported, noimage's, nowhere's and cancelme's gone", time.Minute, func(ctx context.Context) (bool, error) {
				if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
					return false, err
				}
				n := 0
				for _, j := range list.Items {
					if j.Annotations[job.AnnotationReported] != "" {
						n++
					}
				}
				return n == 3 && len(list.Items) == 4, nil
			})
			if err != nil {
				t.Error(err)
			}
			var running []string
			reported := 0
			for _, j := range list.Items {
				if j.Annotations[job.AnnotationReported] != "" {
					reported++
				} else {
					running = append(running, j.Name)
				}
				if c := j.Spec.Template.Spec.InitContainers; len(c) == 0 || c[0].Name != gitea.StepsContainer {
					t.Errorf("Job %s's pod has no %s init container", j.Name, gitea.StepsContainer)
				}
			}
			if len(list.Items) != 4 || reported != 3 || len(running) != 1 {
				t.Fatalf("%d Jobs, %d reported; want 4 (deploy's, slow's and small's reported, long's running, noimage's, nowhere's and cancelme's deleted)", len(list.Items), reported)
			}

			// The second push to long/ cancels the first run's job: Gitea
			// shows it cancelled, and its Job goes.
			long := jobs["long"]
			if err := g.PutFiles(ctx, "infra", map[string]string{"long/second": "2\n"}); err != nil {
				t.Fatal(err)
			}
			var cancelled harness.GiteaJob
			err = harness.WaitFor(ctx, "the first long job cancelled and the second done", 3*time.Minute, func(ctx context.Context) (bool, error) {
				all, err := g.Jobs(ctx, "infra")
				if err != nil {
					return false, err
				}
				done := 0
				for _, j := range all {
					if j.Name != "long" {
						continue
					}
					if j.ID == long.ID && j.Status == "completed" {
						cancelled = j
						done++
					} else if j.ID != long.ID && j.Status == "completed" && j.Conclusion == "success" {
						done++
					}
				}
				return done == 2, nil
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, d.log.String())
			}
			if cancelled.Conclusion != "cancelled" {
				t.Errorf("the first long job: %s, want cancelled", cancelled.Conclusion)
			}
			err = harness.WaitFor(ctx, "the cancelled job's Job to go", time.Minute, func(ctx context.Context) (bool, error) {
				var j batchv1.Job
				err := cfg.Client().Resources(ns).Get(ctx, running[0], ns, &j)
				return apierrors.IsNotFound(err), nil
			})
			if err != nil {
				t.Errorf("%v\n%s", err, d.log.String())
			}

			// Killed while a job runs, the dispatcher takes it up again from
			// its Job and pod log: Gitea gets every line once, and the result.
			if err := g.PutFiles(ctx, "infra", map[string]string{"restart/go": "1\n"}); err != nil {
				t.Fatal(err)
			}
			err = harness.WaitFor(ctx, "the restart job's runner to run", 2*time.Minute, func(ctx context.Context) (bool, error) {
				var pods corev1.PodList
				if err := cfg.Client().Resources(ns).List(ctx, &pods); err != nil {
					return false, err
				}
				for _, p := range pods.Items {
					for _, c := range p.Status.ContainerStatuses {
						if c.Name == "main" && c.State.Running != nil && !slices.Contains(running, p.Labels["batch.kubernetes.io/job-name"]) {
							return true, nil
						}
					}
				}
				return false, nil
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, d.log.String())
			}
			time.Sleep(3 * time.Second)
			d.stop(syscall.SIGKILL)
			time.Sleep(2 * time.Second)
			d.start(ctx, t)
			jobs = waitGiteaJobs(ctx, t, g, "infra", d, map[string]string{
				"deploy": "completed", "nightly": "completed", "build": "completed", "long": "completed", "restart": "completed",
				"slow": "completed", "noimage": "completed", "small": "completed", "nowhere": "completed", "cancelme": "completed",
			})
			restart := jobs["restart"]
			if got, err := g.StepStatuses(ctx, "infra", restart.RunID, restart.ID); restart.Conclusion != "success" || err != nil || strings.Join(got, ",") != "success,success" {
				t.Errorf("restart: %s, steps %v (%v); want success", restart.Conclusion, got, err)
			}
			log, err = g.Log(ctx, "infra", restart.ID)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 20; i++ {
				if n := strings.Count(log, fmt.Sprintf("line %d\n", i)); n != 1 {
					t.Errorf("the restart job's log holds line %d %d times, want once:\n%s", i, n, log)
				}
			}
			if strings.Count(log, "after the count") != 1 {
				t.Errorf("the restart job's log lacks its last step's line:\n%s", log)
			}
			watch.Check(ctx, t)
			return parent
		}).Feature()
	testenv.Test(t, f)
}

// startGiteaDispatcher starts the dispatcher as Gitea g's runner for jobs
// labelled tofu, its registration kept in a namespace of its own.
func startGiteaDispatcher(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, g *harness.Gitea) *dispatcherProcess {
	t.Helper()
	ctl := controlNamespace(ctx, t, cfg, ns)
	image, err := suite.ImageRef(ctx, "dispatcher")
	if err != nil {
		t.Fatal(err)
	}
	// The template of runs-on: small, kept beside the runner registration
	// (the dispatcher refuses one in the runner namespace).
	runnerImage, err := suite.ImageRef(ctx, "runner")
	if err != nil {
		t.Fatal(err)
	}
	small := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "small", Namespace: ctl}, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "main", Image: runnerImage, Env: []corev1.EnvVar{{Name: "RW_TEMPLATE", Value: "small"}}}},
	}}}
	harness.OnRealNode(&small.Template.Spec)
	// The template of runs-on: nowhere: no node has its label.
	nowhere := small.DeepCopy()
	nowhere.Name = "nowhere"
	nowhere.Template.Spec.NodeSelector = map[string]string{"runwarden.dev/e2e-no-such-node": "true"}
	for _, pt := range []*corev1.PodTemplate{small, nowhere} {
		if err := cfg.Client().Resources(ctl).Create(ctx, pt); err != nil {
			t.Fatal(err)
		}
	}
	token := g.RegistrationTokenFile(t)
	d := startDispatcher(ctx, t, cfg, ns, "--source=gitea", "--gitea-url="+g.URL, "--gitea-labels=tofu", "--gitea-template=small="+ctl+"/small", "--gitea-template=nowhere="+ctl+"/nowhere",
		"--gitea-identity-secret="+ctl+"/gitea-runner", "--gitea-steps-image="+image,
		"--gitea-registration-token-file="+token, "--gitea-fetch-interval=500ms", "--gitea-report-interval=1s",
		// Every finished Job kept, to count them.
		"--succeeded-history=20", "--failed-history=20")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the dispatcher's log:\n%s", d.log.String())
		}
	})
	return d
}

// waitGiteaJobs waits until the repository's jobs are those of want, each
// in the status it names; it returns them by name.
func waitGiteaJobs(ctx context.Context, t *testing.T, g *harness.Gitea, repo string, d *dispatcherProcess, want map[string]string) map[string]harness.GiteaJob {
	t.Helper()
	jobs := map[string]harness.GiteaJob{}
	err := harness.WaitFor(ctx, "Gitea's jobs", 4*time.Minute, func(ctx context.Context) (bool, error) {
		all, err := g.Jobs(ctx, repo)
		if err != nil {
			return false, err
		}
		clear(jobs)
		for _, j := range all {
			jobs[j.Name] = j
		}
		for name, status := range want {
			if jobs[name].Status != status {
				return false, nil
			}
		}
		return len(jobs) == len(want), nil
	})
	if err != nil {
		t.Fatalf("%v: %+v\n%s", err, jobs, d.log.String())
	}
	return jobs
}

// sha16 is the first 16 hex digits of s's SHA-256, as sha256sum prints it.
func sha16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

// TestGiteaSourceSurvivesSIGKILL runs two replicas of the dispatcher as one
// Gitea runner while the leader is killed with SIGKILL three times, at
// random moments after Gitea handed out every job (a job handed out in an
// answer the dispatcher never acted on is lost by Gitea's design: no call
// lists a runner's tasks; docs/gitea.md): each job is reported once, with
// its result, and has one Job, never more than --max-concurrent at once.
// On simulated nodes the pods end at once, so the kills fall among the
// reports: before the first UpdateTask, during the runs, in the final
// updates and before the reported mark.
func TestGiteaSourceSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	const jobs, kills = 12, 3
	f := features.New("gitea source survives SIGKILL").
		Assess("12 jobs, two replicas, the leader killed 3 times, one result and one Job each", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			parent := ctx
			ctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
			defer cancel()
			g := harness.StartGitea(ctx, t, suite.RepoRoot, "127.0.0.1")
			if err := g.CreateRepo(ctx, "many"); err != nil {
				t.Fatal(err)
			}
			ctl := controlNamespace(ctx, t, cfg, ns)
			token := g.RegistrationTokenFile(t)
			rs := startReplicas(ctx, t, cfg, ns, 2, append([]string{"--simulated", "--preflight=false", "--max-concurrent", "20",
				"--succeeded-history", "1000", "--failed-history", "1000",
				"--source=gitea", "--gitea-url=" + g.URL, "--gitea-labels=sim", "--gitea-identity-secret=" + ctl + "/gitea-runner",
				"--gitea-steps-image=busybox:stable", "--gitea-registration-token-file=" + token,
				"--gitea-fetch-interval=200ms", "--gitea-report-interval=500ms"}, electionFlags...)...)
			watch := harness.WatchJobs(ctx, t, cfg, ns, 20)
			items := make([]string, jobs)
			for i := range items {
				items[i] = strconv.Itoa(i)
			}
			if err := g.PutFile(ctx, "many", ".gitea/workflows/many.yml", fmt.Sprintf("on: push\njobs:\n  j:\n    runs-on: sim\n    strategy:\n      matrix:\n        i: [%s]\n    steps:\n      - run: echo ${{ matrix.i }}\n", strings.Join(items, ", "))); err != nil {
				t.Fatal(err)
			}
			// Every job handed out and made a Job, its plan stored (a Job
			// still awaiting its Secret when the leader dies cannot run:
			// the plan is given once, and the job is reported failed),
			// before the first kill.
			err := harness.WaitFor(ctx, "a Job for every job", 2*time.Minute, func(ctx context.Context) (bool, error) {
				var list batchv1.JobList
				if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
					return false, err
				}
				n := 0
				for i := range list.Items {
					if !job.AwaitingSecret(&list.Items[i]) {
						n++
					}
				}
				return n == jobs, nil
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, rs.logs())
			}
			rng := mathrand.New(mathrand.NewPCG(3, 5))
			for range kills {
				time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
				rs.killLeader(ctx, t)
			}
			var all []harness.GiteaJob
			err = harness.WaitFor(ctx, "every job to end at Gitea", 3*time.Minute, func(ctx context.Context) (bool, error) {
				var err error
				all, err = g.Jobs(ctx, "many")
				if err != nil || len(all) != jobs {
					return false, err
				}
				for _, j := range all {
					if j.Status != "completed" {
						return false, nil
					}
				}
				return true, nil
			})
			if err != nil {
				t.Fatalf("%v: %+v\n%s", err, all, rs.logs())
			}
			for _, j := range all {
				if j.Conclusion != "success" {
					t.Errorf("job %d: %s, want success", j.ID, j.Conclusion)
				}
				log, err := g.Log(ctx, "many", j.ID)
				if err != nil || strings.Count(log, "runwarden: record: pod ") != 1 {
					t.Errorf("job %d's log holds its record %d times, want once (%v):\n%s", j.ID, strings.Count(log, "runwarden: record: pod "), err, log)
				}
			}
			err = harness.WaitFor(ctx, "every Job marked reported", time.Minute, func(ctx context.Context) (bool, error) {
				var list batchv1.JobList
				if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
					return false, err
				}
				n := 0
				for _, j := range list.Items {
					if j.Annotations[job.AnnotationReported] != "" {
						n++
					}
				}
				return n == jobs && len(list.Items) == jobs, nil
			})
			if err != nil {
				t.Errorf("%v\n%s", err, rs.logs())
			}
			watch.Check(ctx, t)
			return parent
		}).Feature()
	testenv.Test(t, f)
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/gitea"
	"github.com/runwarden/runwarden/e2e/harness"
)

// BenchmarkGiteaJobs measures, against a real Gitea, how fast queued
// Gitea Actions jobs become Jobs through the Gitea source, side by side with
// a loop that only makes the FetchTask calls Gitea's own runner makes (the
// limit of that Gitea: no Job, no Secret). Each side has n jobs of its own
// queued (a matrix, under a label only that side serves) before it starts.
// The runner pods cannot be scheduled (they request more CPU than any node
// has), so every Job stays in flight.
//
//	RUNWARDEN_BENCH_TASKS=200 go test -tags e2e -run '^$' -bench BenchmarkGiteaJobs ./e2e/
func BenchmarkGiteaJobs(b *testing.B) {
	n := 200
	if v := os.Getenv("RUNWARDEN_BENCH_TASKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	cfg := testenv.EnvConf()
	ctx := context.Background()
	g := harness.StartGitea(ctx, b, suite.RepoRoot, "127.0.0.1")
	round := 0
	queue := func(b *testing.B, label string) {
		round++
		repo := fmt.Sprintf("%s-%d", label, round)
		if err := g.CreateRepo(ctx, repo); err != nil {
			b.Fatal(err)
		}
		items := make([]string, n)
		for i := range items {
			items[i] = strconv.Itoa(i)
		}
		wf := fmt.Sprintf("on: push\njobs:\n  j:\n    runs-on: %s\n    strategy:\n      max-parallel: %d\n      matrix:\n        i: [%s]\n    steps:\n      - run: echo ${{ matrix.i }}\n", label, n, strings.Join(items, ", "))
		if err := g.PutFile(ctx, repo, ".gitea/workflows/bench.yml", wf); err != nil {
			b.Fatal(err)
		}
		err := harness.WaitFor(ctx, fmt.Sprintf("Gitea to queue %d jobs", n), 3*time.Minute, func(ctx context.Context) (bool, error) {
			got, err := g.JobCount(ctx, repo)
			return got == n, err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Run("impl=fetch-loop", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			label := fmt.Sprintf("raw%d", round)
			c := gitea.NewClient(&http.Client{Timeout: time.Minute}, g.URL)
			id, err := c.Register(ctx, label, g.RegistrationToken, []string{label})
			if err != nil {
				b.Fatal(err)
			}
			c.SetIdentity(id)
			queue(b, label)
			start := time.Now()
			b.StartTimer()
			var tasks []*runnerv1.Task
			var version int64
			for len(tasks) < n {
				task, v, err := c.FetchTask(ctx, version)
				if err != nil {
					b.Fatal(err)
				}
				version = v
				if task != nil {
					tasks = append(tasks, task)
					version = 0
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "jobs/s")
			now := time.Now()
			for _, task := range tasks {
				_, _ = c.UpdateTask(ctx, &runnerv1.TaskState{Id: task.GetId(), Result: runnerv1.Result_RESULT_CANCELLED, StoppedAt: timestamppb.New(now)}, nil)
			}
		}
	})
	b.Run("impl=gitea-source", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			label := fmt.Sprintf("rw%d", round)
			ns := benchNamespace(b, cfg, "gitea-bench")
			queue(b, label)
			d := startBenchGiteaDispatcher(ctx, b, cfg, ns, g, label, n)
			start := time.Now()
			b.StartTimer()
			err := harness.WaitFor(ctx, fmt.Sprintf("%d Jobs", n), 10*time.Minute, func(ctx context.Context) (bool, error) {
				var jobs batchv1.JobList
				if err := cfg.Client().Resources(ns).List(ctx, &jobs); err != nil {
					return false, err
				}
				return len(jobs.Items) >= n, nil
			})
			b.StopTimer()
			if err != nil {
				b.Fatalf("%v\n%s", err, d.log.String())
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "jobs/s")
			d.stop(os.Interrupt)
		}
	})
}

// startBenchGiteaDispatcher starts the dispatcher as g's runner for label,
// n Jobs at once, its runner pods unschedulable; its readiness wait is
// before the clock starts, its registration after.
func startBenchGiteaDispatcher(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string, g *harness.Gitea, label string, n int) *dispatcherProcess {
	b.Helper()
	token := g.RegistrationTokenFile(b)
	d := startDispatcherProcess(ctx, b, cfg, ns, "--simulated", "--source=gitea", "--gitea-url="+g.URL, "--gitea-labels="+label,
		"--gitea-identity-secret=default/gitea-bench-"+ns, "--gitea-steps-image=busybox:stable", "--gitea-registration-token-file="+token,
		"--gitea-fetch-interval=100ms", "--max-concurrent="+strconv.Itoa(n), "--unschedulable-timeout=10m", "--preflight=false",
		"--kube-api-qps=1000", "--kube-api-burst=2000", "--succeeded-history=100000", "--failed-history=100000")
	unschedulable(b, d)
	b.Cleanup(func() {
		_ = cfg.Client().Resources().Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gitea-bench-" + ns}})
	})
	d.start(ctx, b)
	b.Cleanup(func() { d.stop(os.Interrupt) })
	return d
}

// unschedulable rewrites the dispatcher's pod template so its runner pods
// ask for more CPU than any node has.
func unschedulable(b *testing.B, d *dispatcherProcess) {
	b.Helper()
	for i, a := range d.args {
		if a == "--pod-template" {
			path := d.args[i+1]
			tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "main", Image: "busybox:stable",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100000")}},
			}}}}
			out, err := yaml.Marshal(tmpl)
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(path, out, 0o644); err != nil {
				b.Fatal(err)
			}
			return
		}
	}
	b.Fatal("the dispatcher has no --pod-template")
}

// benchNamespace makes a namespace for one round, deleted when the
// benchmark ends.
func benchNamespace(b *testing.B, cfg *envconf.Config, prefix string) string {
	b.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := cfg.Client().Resources().Create(context.Background(), ns); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), ns) })
	return ns.Name
}

// BenchmarkGiteaLogLines measures how fast a step's output reaches Gitea
// through the Gitea source: a job on the real node prints n lines at once,
// and the clock runs from its runner container's start until Gitea's log
// of the job holds the last line, side by side with a loop sending the
// same rows straight to Gitea's UpdateLog (what that Gitea takes at most).
// The step then pauses 5 s before it ends: the node's container runtime
// cuts the output a container prints just before it exits (the runc shim
// waits 2 s for it; on this node a bare `seq 1 20000` pod's log held
// 15,504 lines, with a 5 s pause all 20,000), which no runner can get back.
//
//	RUNWARDEN_BENCH_LINES=20000 go test -tags e2e -run '^$' -bench BenchmarkGiteaLogLines ./e2e/
func BenchmarkGiteaLogLines(b *testing.B) {
	n := 20000
	if v := os.Getenv("RUNWARDEN_BENCH_LINES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	cfg := testenv.EnvConf()
	ctx := context.Background()
	if err := suite.LoadImages(ctx, "runner", "dispatcher"); err != nil {
		b.Fatal(err)
	}
	g := harness.StartGitea(ctx, b, suite.RepoRoot, realNodeGateway)
	round := 0
	b.Run("impl=updatelog-loop", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			round++
			label := fmt.Sprintf("raw%d", round)
			repo := label
			c := gitea.NewClient(&http.Client{Timeout: time.Minute}, g.URL)
			id, err := c.Register(ctx, label, g.RegistrationToken, []string{label})
			if err != nil {
				b.Fatal(err)
			}
			c.SetIdentity(id)
			if err := g.CreateRepo(ctx, repo); err != nil {
				b.Fatal(err)
			}
			if err := g.PutFile(ctx, repo, ".gitea/workflows/lines.yml", fmt.Sprintf("on: push\njobs:\n  lines:\n    runs-on: %s\n    steps:\n      - run: seq 1 %d; sleep 5\n", label, n)); err != nil {
				b.Fatal(err)
			}
			var task *runnerv1.Task
			err = harness.WaitFor(ctx, "the job", 2*time.Minute, func(ctx context.Context) (bool, error) {
				var err error
				task, _, err = c.FetchTask(ctx, 0)
				return task != nil, err
			})
			if err != nil {
				b.Fatal(err)
			}
			rows := make([]*runnerv1.LogRow, n)
			now := timestamppb.Now()
			for i := range rows {
				rows[i] = &runnerv1.LogRow{Time: now, Content: strconv.Itoa(i + 1)}
			}
			start := time.Now()
			b.StartTimer()
			// The source sends what its log holds each report: here, as
			// fast as Gitea answers, chunks of the size one 3 s report of
			// a fast step carries.
			var ack int64
			for ack < int64(n) {
				end := min(int(ack)+5000, n)
				if ack, err = c.UpdateLog(ctx, task.GetId(), ack, rows[ack:end], end == n); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "lines/s")
			_, _ = c.UpdateTask(ctx, &runnerv1.TaskState{Id: task.GetId(), Result: runnerv1.Result_RESULT_SUCCESS, StoppedAt: timestamppb.Now()}, nil)
		}
	})
	b.Run("impl=gitea-source", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			round++
			label := fmt.Sprintf("rw%d", round)
			repo := label
			ns := benchNamespace(b, cfg, "gitea-lines")
			token := g.RegistrationTokenFile(b)
			image, err := suite.ImageRef(ctx, "dispatcher")
			if err != nil {
				b.Fatal(err)
			}
			d := startDispatcher(ctx, b, cfg, ns, "--source=gitea", "--gitea-url="+g.URL, "--gitea-labels="+label,
				"--gitea-identity-secret=default/gitea-lines-"+ns, "--gitea-steps-image="+image, "--gitea-registration-token-file="+token,
				"--gitea-fetch-interval=100ms")
			if err := g.CreateRepo(ctx, repo); err != nil {
				b.Fatal(err)
			}
			if err := g.PutFile(ctx, repo, ".gitea/workflows/lines.yml", fmt.Sprintf("on: push\njobs:\n  lines:\n    runs-on: %s\n    steps:\n      - run: seq 1 %d\n", label, n)); err != nil {
				b.Fatal(err)
			}
			var started time.Time
			err = harness.WaitFor(ctx, "the runner container to start", 3*time.Minute, func(ctx context.Context) (bool, error) {
				var pods corev1.PodList
				if err := cfg.Client().Resources(ns).List(ctx, &pods); err != nil {
					return false, err
				}
				for _, p := range pods.Items {
					for _, c := range p.Status.ContainerStatuses {
						if c.Name == "main" && c.State.Running != nil {
							started = c.State.Running.StartedAt.Time
						} else if c.Name == "main" && c.State.Terminated != nil {
							started = c.State.Terminated.StartedAt.Time
						}
					}
				}
				return !started.IsZero(), nil
			})
			if err != nil {
				b.Fatalf("%v\n%s", err, d.log.String())
			}
			b.StartTimer()
			var done time.Time
			last := fmt.Sprintf(" %d\n", n)
			err = harness.WaitForEvery(ctx, "Gitea's log to hold the last line", 5*time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, error) {
				jobs, err := g.Jobs(ctx, repo)
				if err != nil || len(jobs) != 1 {
					return false, err
				}
				log, err := g.Log(ctx, repo, jobs[0].ID)
				if err != nil || !strings.Contains(log, last) {
					return false, nil
				}
				done = time.Now()
				return true, nil
			})
			b.StopTimer()
			if err != nil {
				b.Fatalf("%v\n%s", err, d.log.String())
			}
			var jobs []harness.GiteaJob
			err = harness.WaitFor(ctx, "the job to end at Gitea", 2*time.Minute, func(ctx context.Context) (bool, error) {
				jobs, err = g.Jobs(ctx, repo)
				return err == nil && len(jobs) == 1 && jobs[0].Status == "completed", err
			})
			if err != nil {
				b.Fatalf("%v\n%s", err, d.log.String())
			}
			log, err := g.Log(ctx, repo, jobs[0].ID)
			if err != nil || !strings.Contains(log, fmt.Sprintf(" %d\n", n)) || jobs[0].Conclusion != "success" {
				var gaps []string
				want := 1
				for _, l := range strings.Split(log, "\n") {
					_, v, _ := strings.Cut(l, " ")
					if k, err := strconv.Atoi(v); err == nil {
						if k != want {
							gaps = append(gaps, fmt.Sprintf("%d after %d", k, want-1))
						}
						want = k + 1
					}
				}
				kl, kerr := suite.Kubectl(ctx, cfg, "logs", "-n", ns, "-l", "runwarden.dev/runner=true", "-c", "main", "--tail=-1")
				b.Logf("kubectl logs: %d lines (%v), ends %q", strings.Count(kl, "\n"), kerr, kl[max(0, len(kl)-200):])
				b.Fatalf("the job: %s, its log (%d lines, gaps %v) begins %q and ends %q (%v)\n%s", jobs[0].Conclusion, strings.Count(log, "\n"), gaps[:min(len(gaps), 20)], log[:min(len(log), 300)], log[max(0, len(log)-300):], err, tail(d.log.String(), 3000))
			}
			b.ReportMetric(float64(n)/done.Sub(started).Seconds(), "lines/s")
			d.stop(os.Interrupt)
			_ = cfg.Client().Resources().Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "gitea-lines-" + ns}})
		}
	})
}

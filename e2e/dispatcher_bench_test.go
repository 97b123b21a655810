//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient"
	"sigs.k8s.io/e2e-framework/klient/k8s/resources"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
)

// BenchmarkDispatcherJobs measures, on the suite's cluster, how fast tasks
// become Jobs, side by side with a plain client-go loop creating the same
// number of Jobs (the limit of that API server), and the dispatcher's memory
// with all of them in flight. The runner pods cannot be scheduled (they
// request more CPU than any node has), so every Job stays in flight.
//
//	RUNWARDEN_BENCH_TASKS=1000 go test -tags e2e -run '^$' -bench BenchmarkDispatcherJobs ./e2e/
func BenchmarkDispatcherJobs(b *testing.B) {
	n := 500
	if v := os.Getenv("RUNWARDEN_BENCH_TASKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	cfg := testenv.EnvConf()
	ctx := context.Background()
	installCRD(ctx, b, cfg)
	// The raw loop gets the same client limits as the dispatcher (--kube-api-qps
	// 1000 below), so the comparison is of the work each does per Job.
	fast := fastClient(b, cfg)

	newNamespace := func(b *testing.B, prefix string) string {
		name := fmt.Sprintf("bench-%s-%d", prefix, time.Now().UnixNano()%1_000_000)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := fast.Resources().Create(ctx, ns); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			// Wait until it is gone, so the next measurement does not
			// share the API server with the deletion of thousands of Jobs.
			r := cfg.Client().Resources()
			_ = r.Delete(context.Background(), ns)
			for range 600 {
				if err := r.Get(context.Background(), name, "", &corev1.Namespace{}); err != nil {
					return
				}
				time.Sleep(time.Second)
			}
		})
		return name
	}

	rawJob := func(ns string, i int) *batchv1.Job {
		return &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("raw-%05d", i), Namespace: ns},
			Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					NodeSelector:  map[string]string{"runwarden.dev/bench": "nowhere"},
					Containers:    []corev1.Container{{Name: "main", Image: "busybox:stable"}},
				}},
			},
		}
	}
	// RUNWARDEN_BENCH_ROUNDS=R runs every implementation R times, one
	// after another in each round, so a slow spell of the shared machine
	// falls on all of them alike (-count would run each R times in a row).
	// Each run's name then ends in /round=N: compare them with
	// benchstat -ignore /round.
	rounds := 1
	if v := os.Getenv("RUNWARDEN_BENCH_ROUNDS"); v != "" {
		var err error
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			b.Fatalf("RUNWARDEN_BENCH_ROUNDS=%q: want a count of at least 1", v)
		}
	}
	for round := range rounds {
		name := func(format string, a ...any) string {
			if rounds > 1 {
				format += fmt.Sprintf("/round=%d", round+1)
			}
			return fmt.Sprintf(format, a...)
		}
		// One loop, then eight in parallel (as many as the dispatcher's workers).
		for _, workers := range []int{1, 8} {
			b.Run(name("tasks=%d/impl=client-go-%dw", n, workers), func(b *testing.B) {
				for b.Loop() {
					ns := newNamespace(b, "raw")
					r := fast.Resources(ns)
					before := readAPICalls(ctx, b, fast)
					start := time.Now()
					var g errgroup.Group
					g.SetLimit(workers)
					for i := range n {
						g.Go(func() error { return r.Create(ctx, rawJob(ns, i)) })
					}
					if err := g.Wait(); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(n)/time.Since(start).Seconds(), "jobs/s")
					reportAPICalls(b, before, readAPICalls(ctx, b, fast), n)
				}
			})
		}

		// Loops making the API calls the kube source must make for a task,
		// and no more: the RunnerTasks listed once (as the dispatcher's cache
		// does when it starts), then for each task its Job (owned by the
		// task) and the task's Running status, written from the listed copy.
		// The dispatcher's rate against this one is what its own work costs.
		// Eight loops, and sixteen: as many as the kube source's reconcile
		// workers, for when the API server's latency rather than its
		// capacity bounds eight.
		for _, loops := range []int{8, 16} {
			b.Run(name("tasks=%d/impl=client-go-%dw-kube-calls", n, loops), func(b *testing.B) {
				for b.Loop() {
					ns := newNamespace(b, "rawk")
					r := fast.Resources(ns)
					createBenchTasks(ctx, b, r, ns, n)
					before := readAPICalls(ctx, b, fast)
					start := time.Now()
					var tasks v1alpha1.RunnerTaskList
					if err := r.List(ctx, &tasks); err != nil || len(tasks.Items) != n {
						b.Fatalf("%d RunnerTasks listed, want %d (%v)", len(tasks.Items), n, err)
					}
					var g errgroup.Group
					g.SetLimit(loops)
					for i := range tasks.Items {
						rt := &tasks.Items[i]
						g.Go(func() error {
							j := rawJob(ns, i)
							j.OwnerReferences = []metav1.OwnerReference{{
								APIVersion: v1alpha1.GroupVersion.String(), Kind: "RunnerTask", Name: rt.Name, UID: rt.UID,
								Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
							}}
							if err := r.Create(ctx, j); err != nil {
								return err
							}
							rt.Status.Phase, rt.Status.JobName, rt.Status.StartTime = v1alpha1.PhaseRunning, j.Name, ptr.To(metav1.Now())
							return r.UpdateStatus(ctx, rt)
						})
					}
					if err := g.Wait(); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(n)/time.Since(start).Seconds(), "jobs/s")
					reportAPICalls(b, before, readAPICalls(ctx, b, fast), n)
				}
			})
		}

		// The kube source built from another checkout (RUNWARDEN_BENCH_BASE,
		// say a worktree of the commit before a change), measured in the same
		// run as this one's.
		if base := os.Getenv("RUNWARDEN_BENCH_BASE"); base != "" {
			b.Run(name("tasks=%d/impl=dispatcher-base", n), func(b *testing.B) {
				for b.Loop() {
					kubeSourceBench(ctx, b, n, 1, newNamespace, "--source-dir="+base)
				}
			})
		}

		// One dispatcher, then two replicas with --leader-elect (the chart's
		// default): the leader does the work while the standby starts, warms
		// its caches and watches the same objects.
		for _, replicas := range []int{1, 2} {
			impl := "dispatcher"
			if replicas > 1 {
				impl = fmt.Sprintf("dispatcher-%d-replicas", replicas)
			}
			b.Run(name("tasks=%d/impl=%s", n, impl), func(b *testing.B) {
				for b.Loop() {
					kubeSourceBench(ctx, b, n, replicas, newNamespace)
				}
			})

			b.Run(name("tasks=%d/impl=%s-orchestrator", n, impl), func(b *testing.B) {
				for b.Loop() {
					orchestratorBench(ctx, b, n, 100, replicas, newNamespace)
				}
			})
		}
	}

	if v := os.Getenv("RUNWARDEN_BENCH_DRAIN"); v != "" {
		drain, err := strconv.Atoi(v)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("tasks=%d/drain/impl=dispatcher-orchestrator", drain), func(b *testing.B) {
			for b.Loop() {
				drainBench(ctx, b, drain, newNamespace)
			}
		})
	}
}

// orchestratorBench runs the orchestrator source against the fake
// orchestrator: first, one at a time, lat tasks measure lease-to-Job
// latency (the lease handed out to the dispatcher's job-created event, both
// stamped on this machine's clock); then n unschedulable tasks (so all stay
// in flight) become Jobs.
func orchestratorBench(ctx context.Context, b *testing.B, n, lat, replicas int, newNamespace func(*testing.B, string) string) {
	cfg := testenv.EnvConf()
	ns := newNamespace(b, "orch")
	fast := fastClient(b, cfg)
	before := readAPICalls(ctx, b, fast)
	o := newOrchestrator(b, orchestratortest.Options{LeaseSeconds: 120, MaxWait: 5 * time.Second})
	d, standby := startBenchReplicas(ctx, b, cfg, ns, replicas, append(orchestratorFlags(o), "--simulated", "--max-concurrent", strconv.Itoa(n+lat),
		"--succeeded-history", "100000", "--failed-history", "100000", "--preflight=false", "--stream-logs=false",
		"--kube-api-qps", "1000", "--kube-api-burst", "2000", "--unschedulable-timeout", "1h")...)
	standby()
	big := &orchestrator.Resources{Requests: map[string]orchestrator.Quantity{"cpu": "100000"}}
	created := func(id string) bool {
		for _, e := range o.srv.Task(id).Events {
			if e.Type == orchestrator.EventJobCreated {
				return true
			}
		}
		return false
	}
	var lats []time.Duration
	for i := range lat {
		id := fmt.Sprintf("lat-%05d", i)
		o.srv.Add(orchestrator.Task{ID: id, Command: []string{"true"}, Resources: big})
		for !created(id) {
			time.Sleep(time.Millisecond)
		}
		rec := o.srv.Task(id)
		lats = append(lats, rec.Events[0].Time.Sub(rec.Leases[0].IssuedAt))
	}
	if len(lats) > 0 {
		slices.Sort(lats)
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds())/1000, "lease-to-job-p50-ms")
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds())/1000, "lease-to-job-p99-ms")
	}
	start, cpu := time.Now(), cpuTime(b, d.cmd.Process.Pid)
	for i := range n {
		o.srv.Add(orchestrator.Task{ID: fmt.Sprintf("task-%05d", i), Command: []string{"true"}, Resources: big})
	}
	if out := os.Getenv("RUNWARDEN_BENCH_CPUPROFILE"); out != "" && d.pprof != "" {
		go saveProfile(d.pprof, out, "profile")
	}
	waitCreated(ctx, b, cfg, ns, n+lat, start)
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "jobs/s")
	b.ReportMetric(float64((cpuTime(b, d.cmd.Process.Pid)-cpu).Microseconds())/1000/float64(n), "cpu-ms/task")
	for countCreated(o.srv) < n+lat {
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("only %d of %d Jobs reported after 5 minutes\n%s", countCreated(o.srv), n, tail(d.log.String(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "reported/s")
	reportAPICalls(b, before, readAPICalls(ctx, b, fast), n+lat)
	b.ReportMetric(float64(rssKiB(d.cmd.Process.Pid))/1024, "rss-MiB")
	if out := os.Getenv("RUNWARDEN_BENCH_HEAPPROFILE"); out != "" && d.pprof != "" {
		saveProfile(d.pprof, out, "heap")
	}
}

// startBenchReplicas starts one dispatcher, or with replicas > 1 the
// leader of that many with --leader-elect (default election settings), and
// returns it once it leads, with a function that starts the standbys and
// waits until they are healthy. Every process stops when b ends.
func startBenchReplicas(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string, replicas int, args ...string) (*dispatcherProcess, func()) {
	b.Helper()
	if replicas <= 1 {
		return startDispatcher(ctx, b, cfg, ns, args...), func() {}
	}
	args = append(args, "--leader-elect")
	var ds []*dispatcherProcess
	for range replicas {
		ds = append(ds, startDispatcherProcess(ctx, b, cfg, ns, slices.Clone(args)...))
	}
	b.Cleanup(func() {
		for _, d := range ds {
			d.stop(os.Interrupt)
		}
	})
	ds[0].start(ctx, b)
	return ds[0], func() {
		for _, d := range ds[1:] {
			d.startStandby(ctx, b)
		}
	}
}

// saveProfile saves one of the dispatcher's profiles (profile: three
// seconds of CPU).
func saveProfile(addr, path, profile string) {
	u := "http://" + addr + "/debug/pprof/" + profile
	if profile == "profile" {
		u += "?seconds=3"
	}
	resp, err := http.Get(u)
	if err != nil {
		return
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	_ = os.WriteFile(path, b, 0o644)
}

// waitCreated waits until namespace ns holds n Jobs, watching them from
// this process as the client-go loops count theirs, in this process: a Job
// counts once the API server has it. It reads nothing of the dispatcher's:
// reading its /metrics every 20 ms took 15% of its CPU in a profile of the
// kube source, CPU the API server it shares the machine with then lacked,
// and which the loops never pay. The watch is protobuf, as the dispatcher's
// own watch of its Jobs, so the API server encodes each event once for both.
func waitCreated(ctx context.Context, b *testing.B, cfg *envconf.Config, ns string, n int, start time.Time) {
	b.Helper()
	rc := rest.CopyConfig(cfg.Client().RESTConfig())
	rc.QPS, rc.Burst = 1000, 2000
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	jobs := cs.BatchV1().Jobs(ns)
	list, err := jobs.List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w, err := jobs.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	timeout := time.NewTimer(5*time.Minute - time.Since(start))
	defer timeout.Stop()
	for have := len(list.Items); have < n; {
		select {
		case ev, ok := <-w.ResultChan():
			switch {
			case !ok:
				b.Fatalf("the watch of namespace %s's Jobs ended with %d of %d made", ns, have, n)
			case ev.Type == watch.Error:
				b.Fatalf("watching namespace %s's Jobs: %v", ns, apierrors.FromObject(ev.Object))
			case ev.Type == watch.Added:
				have++
			}
		case <-timeout.C:
			b.Fatalf("only %d of %d Jobs made in namespace %s after 5 minutes", have, n, ns)
		}
	}
}

// waitMetric waits until one of the dispatcher's metrics (a counter, or a
// histogram's _count) reaches n, read every 20 ms.
func waitMetric(b *testing.B, d *dispatcherProcess, name string, n int, start time.Time) {
	b.Helper()
	for {
		got := metricValue(d, name)
		if got >= n {
			return
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("%s only %d of %d after 5 minutes\n%s", name, got, n, tail(d.log.String(), 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metricValue reads one unlabelled metric of the dispatcher's; 0 when it
// cannot.
func metricValue(d *dispatcherProcess, name string) int {
	req, err := http.NewRequest(http.MethodGet, "http://"+d.metrics+"/metrics", nil)
	if err != nil {
		return 0
	}
	// Uncompressed: read every 20 ms, compressing the answer took an
	// eighth of the dispatcher's CPU in a profile of the kube source.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f)
		}
	}
	return 0
}

func countCreated(srv *orchestratortest.Server) int {
	n := 0
	for _, t := range srv.Tasks() {
		if len(t.Events) > 0 {
			n++
		}
	}
	return n
}

// drainBench runs n tasks that succeed at once through the orchestrator
// source, at most 200 at a time, and checks none is lost or run twice.
func drainBench(ctx context.Context, b *testing.B, n int, newNamespace func(*testing.B, string) string) {
	cfg := testenv.EnvConf()
	ns := newNamespace(b, "drain")
	o := newOrchestrator(b, orchestratortest.Options{LeaseSeconds: 120, MaxWait: 5 * time.Second})
	d := startOrchestratorDispatcher(ctx, b, cfg, ns, o, "--simulated", "--max-concurrent", "200",
		"--succeeded-history", "50", "--preflight=false", "--stream-logs=false",
		"--kube-api-qps", "1000", "--kube-api-burst", "2000", "--unschedulable-timeout", "1h")
	start := time.Now()
	ids := orchestratorTasks(o.srv, "drain", n)
	for o.srv.Done() < n {
		if time.Since(start) > 30*time.Minute {
			b.Fatalf("only %d of %d tasks done after 30 minutes", o.srv.Done(), n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "tasks/s")
	lost, twice := 0, 0
	for _, id := range ids {
		rec := o.srv.Task(id)
		switch {
		case rec.Final == nil || rec.Final.Type != orchestrator.EventSucceeded:
			lost++
		case rec.FinalStored != 1 || len(rec.Leases) != 1:
			twice++
		}
	}
	b.ReportMetric(float64(lost), "lost")
	b.ReportMetric(float64(twice), "twice")
	if lost > 0 || twice > 0 {
		b.Errorf("%d tasks lost, %d leased or reported more than once", lost, twice)
	}
	d.stop(os.Interrupt)
}

// cpuTime reads the CPU time a process has used so far, in user and kernel
// mode, all its threads: the dispatcher's own cost, which the API server's
// speed on a shared machine does not change.
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 12th and 13th of them, in clock
	// ticks (USER_HZ, 100 on Linux).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// rssKiB reads a process's resident memory.
func rssKiB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	return 0
}

// fastClient is the suite's client without its request limits (1,000
// requests/s, as the dispatcher gets with --kube-api-qps), knowing
// RunnerTasks: a benchmark's own reads and writes must not wait on them.
func fastClient(b testing.TB, cfg *envconf.Config) klient.Client {
	b.Helper()
	rc := rest.CopyConfig(cfg.Client().RESTConfig())
	rc.QPS, rc.Burst = 1000, 2000
	fast, err := klient.New(rc)
	if err != nil {
		b.Fatal(err)
	}
	return fast
}

// createBenchTasks creates n RunnerTasks whose pods cannot be scheduled
// (they request more CPU than any node has), so every Job stays in flight.
func createBenchTasks(ctx context.Context, b *testing.B, r *resources.Resources, ns string, n int) {
	b.Helper()
	for i := range n {
		rt := &v1alpha1.RunnerTask{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("task-%05d", i), Namespace: ns},
			Spec: v1alpha1.RunnerTaskSpec{Command: []string{"true"}, Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100000")},
			}},
		}
		if err := r.Create(ctx, rt); err != nil {
			b.Fatal(err)
		}
	}
}

// kubeSourceBench runs the kube source: n unschedulable RunnerTasks made
// first, then the dispatcher (or, with replicas > 1, the leader of that
// many) started, timed until it has made n Jobs. extra goes to
// startDispatcherProcess (--source-dir=DIR builds another checkout's).
func kubeSourceBench(ctx context.Context, b *testing.B, n, replicas int, newNamespace func(*testing.B, string) string, extra ...string) {
	cfg := testenv.EnvConf()
	fast := fastClient(b, cfg)
	ns := newNamespace(b, "disp")
	r := fast.Resources(ns)
	createBenchTasks(ctx, b, r, ns, n)
	before := readAPICalls(ctx, b, fast)
	d, standby := startBenchReplicas(ctx, b, cfg, ns, replicas, append([]string{"--simulated", "--max-concurrent", strconv.Itoa(n),
		"--succeeded-history", "100000", "--failed-history", "100000", "--preflight=false",
		"--kube-api-qps", "1000", "--kube-api-burst", "2000", "--unschedulable-timeout", "1h"}, extra...)...)
	start, cpu := time.Now(), cpuTime(b, d.cmd.Process.Pid)
	standby()
	logRevision(b, extra)
	if out := os.Getenv("RUNWARDEN_BENCH_CPUPROFILE"); out != "" && d.pprof != "" {
		suffix := ".kube"
		if len(extra) > 0 {
			suffix = ".kube-base"
		}
		go saveProfile(d.pprof, out+suffix, "profile")
	}
	waitCreated(ctx, b, cfg, ns, n, start)
	elapsed, cpu := time.Since(start), cpuTime(b, d.cmd.Process.Pid)-cpu
	// Every task's Running status written (each is timed into the
	// queue-wait histogram once written), then the calls.
	waitMetric(b, d, "runwarden_dispatcher_task_queue_wait_seconds_count", n, start)
	reportAPICalls(b, before, readAPICalls(ctx, b, fast), n)
	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs); err != nil || len(jobs.Items) != n {
		b.Fatalf("%d Jobs listed, want %d (%v)", len(jobs.Items), n, err)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(n), "cpu-ms/task")
	b.ReportMetric(float64(rssKiB(d.cmd.Process.Pid))/1024, "rss-MiB")
}

// logRevision logs the commit the dispatcher was built from (this checkout,
// or --source-dir's), "-dirty" with changes not committed.
func logRevision(b *testing.B, extra []string) {
	dir := suite.RepoRoot
	for _, a := range extra {
		if d, ok := strings.CutPrefix(a, "--source-dir="); ok {
			dir = d
		}
	}
	out, err := exec.Command("git", "-C", dir, "describe", "--always", "--dirty").Output()
	b.Logf("dispatcher built from %s at %s (%v)", dir, strings.TrimSpace(string(out)), err)
}

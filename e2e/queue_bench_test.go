//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient"
	"sigs.k8s.io/e2e-framework/pkg/envconf"

	"github.com/runwarden/runwarden/dispatcher/kube"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/e2e/harness"
	"github.com/runwarden/runwarden/internal/contract"
)

// BenchmarkQueueing measures what queueing through Kueue costs: N
// RunnerTasks (RUNWARDEN_BENCH_TASKS, default 200) submitted at once on
// simulated nodes, with room for all of them (--max-concurrent N, and with
// Kueue a ClusterQueue of N pods), until every task's Job is admitted
// (exists and is unsuspended): admitted tasks per second, and each task's
// latency from its submission to its Job's admission (median and p95,
// sampled every 50 ms). impl=dispatcher is the dispatcher's own slots,
// impl=kueue the same dispatcher with --kueue; source=kube submits
// RunnerTasks, source=orchestrator has an in-memory orchestrator hand out
// leases, the latency then counted from each task's first lease.
//
//	go test -tags e2e -run '^$' -bench BenchmarkQueueing -benchtime 1x -count 3 ./e2e/
func BenchmarkQueueing(b *testing.B) {
	cfg := testenv.EnvConf()
	ctx := context.Background()
	installCRD(ctx, b, cfg)
	kueueUp(ctx, b)
	fast := fastClient(b, cfg)
	n := 200
	if v, err := strconv.Atoi(os.Getenv("RUNWARDEN_BENCH_TASKS")); err == nil && v > 0 {
		n = v
	}
	for _, source := range []string{"kube", "orchestrator"} {
		for _, impl := range []string{"dispatcher", "kueue"} {
			b.Run("source="+source+"/impl="+impl, func(b *testing.B) {
				for b.Loop() {
					benchQueueingOnce(ctx, b, cfg, fast, source, impl, n)
				}
			})
		}
	}
}

// benchQueueingOnce runs n tasks of a source through the dispatcher, with
// or without Kueue, and reports admitted tasks per second and each task's
// latency from its submission (kube: the RunnerTask made; orchestrator: its
// lease issued) to its Job's admission.
func benchQueueingOnce(ctx context.Context, b *testing.B, cfg *envconf.Config, fast klient.Client, source, impl string, n int) {
	ns := fmt.Sprintf("bench-queue-%d", time.Now().UnixNano()%1_000_000)
	r := cfg.Client().Resources()
	if err := r.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = r.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}) }()
	args := []string{"--simulated", "--preflight=false", "--max-concurrent", strconv.Itoa(n), "--succeeded-history", strconv.Itoa(10 * n),
		"--kube-api-qps", "1000", "--kube-api-burst", "2000"}
	if impl == "kueue" {
		kueueNamespace(harness.WithNamespace(ctx, ns), b, cfg)
		objs, flavor, _, _ := kueueObjects(ns)
		applyObjects(ctx, b, cfg, objs+"---\n"+clusterQueue(ns, "bench", flavor, "", n, false))
		args = append(args, "--kueue", "--default-queue", "bench", "--max-queued", strconv.Itoa(n))
	}
	submitted := map[string]time.Time{} // by task ID, as Jobs carry it
	var o *fakeOrchestrator
	if source == "orchestrator" {
		o = newOrchestrator(b, orchestratortest.Options{LeaseSeconds: 60, MaxWait: 2 * time.Second})
		args = append(orchestratorFlags(o), args...)
	}
	d := startDispatcher(ctx, b, cfg, ns, args...)
	defer d.stop(os.Interrupt)
	start := time.Now()
	for i := range n {
		name := fmt.Sprintf("task-%04d", i)
		if o != nil {
			o.srv.Add(orchestrator.Task{ID: name, Command: []string{"true"}})
			continue
		}
		rt := runnerTask(ns, name, "true")
		if err := fast.Resources(ns).Create(ctx, rt); err != nil {
			b.Fatal(err)
		}
		submitted[kube.TaskID(rt)] = time.Now()
	}
	admitted := map[string]time.Time{}
	deadline := time.Now().Add(5 * time.Minute)
	for len(admitted) < n {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d tasks admitted after 5m\n%s", len(admitted), n, tail(d.log.String(), 3000))
		}
		var jobs batchv1.JobList
		if err := fast.Resources(ns).List(ctx, &jobs); err == nil {
			now := time.Now()
			for _, j := range jobs.Items {
				id := j.Annotations[contract.TaskID]
				if id == "" || ptr.Deref(j.Spec.Suspend, false) {
					continue
				}
				if _, seen := admitted[id]; !seen {
					admitted[id] = now
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	if o != nil {
		for id := range admitted {
			if leases := o.srv.Task(id).Leases; len(leases) > 0 {
				submitted[id] = leases[0].IssuedAt
			}
		}
	}
	var lat []float64
	for id, at := range admitted {
		if sub, ok := submitted[id]; ok {
			lat = append(lat, float64(at.Sub(sub).Milliseconds()))
		}
	}
	if len(lat) < n {
		b.Fatalf("%d of %d admitted tasks have a submission time", len(lat), n)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(n)/elapsed.Seconds(), "tasks/s")
	b.ReportMetric(lat[len(lat)/2], "p50-ms")
	b.ReportMetric(lat[len(lat)*95/100], "p95-ms")
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
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
	rc := rest.CopyConfig(cfg.Client().RESTConfig())
	rc.QPS, rc.Burst = 1000, 2000
	fast, err := klient.New(rc)
	if err != nil {
		b.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(fast.Resources().GetScheme()); err != nil {
		b.Fatal(err)
	}

	newNamespace := func(b *testing.B, prefix string) string {
		name := fmt.Sprintf("bench-%s-%d", prefix, time.Now().UnixNano()%1_000_000)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := fast.Resources().Create(ctx, ns); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), ns) })
		return name
	}

	b.Run(fmt.Sprintf("tasks=%d/impl=client-go", n), func(b *testing.B) {
		for b.Loop() {
			ns := newNamespace(b, "raw")
			r := fast.Resources(ns)
			start := time.Now()
			for i := range n {
				j := &batchv1.Job{
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
				if err := r.Create(ctx, j); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "jobs/s")
		}
	})

	b.Run(fmt.Sprintf("tasks=%d/impl=dispatcher", n), func(b *testing.B) {
		for b.Loop() {
			ns := newNamespace(b, "disp")
			r := fast.Resources(ns)
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
			d := startDispatcher(ctx, b, cfg, ns, "--simulated", "--max-concurrent", strconv.Itoa(n),
				"--succeeded-history", "100000", "--failed-history", "100000", "--preflight=false",
				"--kube-api-qps", "1000", "--kube-api-burst", "2000")
			start := time.Now()
			for {
				var jobs batchv1.JobList
				if err := r.List(ctx, &jobs); err != nil {
					b.Fatal(err)
				}
				if len(jobs.Items) >= n {
					break
				}
				if time.Since(start) > 5*time.Minute {
					b.Fatalf("only %d of %d Jobs after 5 minutes\n%s", len(jobs.Items), n, d.log.String())
				}
				time.Sleep(100 * time.Millisecond)
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(n)/elapsed.Seconds(), "jobs/s")
			b.ReportMetric(float64(rssKiB(d.cmd.Process.Pid))/1024, "rss-MiB")
			d.stop(os.Interrupt)
		}
	})
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

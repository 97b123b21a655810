//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
)

// BenchmarkDispatcherFailover measures how long dispatching stops when the
// leader of two replicas goes, with the default election settings (lease
// 15 s, renew deadline 10 s, retry period 1 s): from the leader's SIGKILL,
// or its SIGTERM, to the Job of a task submitted right after it died, which
// only the new leader can make. The stopped replica starts again as the
// standby for the next round. Both task sources.
//
//	go test -tags e2e -run '^$' -bench BenchmarkDispatcherFailover -benchtime 3x ./e2e/
func BenchmarkDispatcherFailover(b *testing.B) {
	cfg := testenv.EnvConf()
	ctx := context.Background()
	installCRD(ctx, b, cfg)
	for _, source := range []string{"kube", "orchestrator"} {
		for _, stop := range []struct {
			name string
			sig  os.Signal
		}{{"SIGKILL", os.Kill}, {"SIGTERM", os.Interrupt}} {
			b.Run(fmt.Sprintf("source=%s/stop=%s", source, stop.name), func(b *testing.B) {
				ns := fmt.Sprintf("bench-failover-%d", time.Now().UnixNano()%1_000_000)
				r := cfg.Client().Resources()
				if err := r.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = r.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}) })
				args := []string{"--simulated", "--preflight=false", "--succeeded-history", "1000", "--leader-elect"}
				var submit func(i int)
				switch source {
				case "kube":
					submit = func(i int) {
						if err := r.Create(ctx, runnerTask(ns, fmt.Sprintf("task-%03d", i), "true")); err != nil {
							b.Fatal(err)
						}
					}
				default:
					o := newOrchestrator(b, orchestratortest.Options{LeaseSeconds: 30, MaxWait: 2 * time.Second})
					args = append(orchestratorFlags(o), args...)
					submit = func(i int) {
						o.srv.Add(orchestrator.Task{ID: fmt.Sprintf("task-%03d", i), Command: []string{"true"}})
					}
				}
				rs := startReplicas(ctx, b, cfg, ns, 2, args...)
				// Job names carry the task's name (job.Name).
				hasJob := func(task string) bool {
					var list batchv1.JobList
					if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
						return false
					}
					return slices.ContainsFunc(list.Items, func(j batchv1.Job) bool { return strings.Contains(j.Name, task) })
				}
				var took []time.Duration
				i := 0
				for b.Loop() {
					l := rs.waitLeader(ctx, b)
					stopped := time.Now()
					rs.stop(l, stop.sig)
					submit(i)
					task := fmt.Sprintf("task-%03d", i)
					i++
					for !hasJob(task) {
						if time.Since(stopped) > 2*time.Minute {
							b.Fatalf("no Job 2 minutes after the leader stopped\n%s", rs.logs())
						}
						time.Sleep(20 * time.Millisecond)
					}
					took = append(took, time.Since(stopped))
					rs.startStandby(ctx, b, l)
				}
				var sum time.Duration
				for _, d := range took {
					sum += d
				}
				b.ReportMetric(sum.Seconds()/float64(len(took)), "failover-s")
				b.ReportMetric(slices.Max(took).Seconds(), "max-failover-s")
			})
		}
	}
}

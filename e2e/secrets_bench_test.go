//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s/resources"

	"github.com/runwarden/runwarden/e2e/harness"
)

// BenchmarkSecretsPodStart measures what resolving secret references costs a
// runner pod on the real node: the time from creating its Job to its runner
// container running, with 10 Vault references (the resolver init container,
// its Vault logins and reads, the env file) and with none (the same pod, the
// same webhook). It reports s/start, the mean over b.N pods.
//
//	make bench-secrets
func BenchmarkSecretsPodStart(b *testing.B) {
	cfg := testenv.EnvConf()
	ctx := context.Background()
	var nodes corev1.NodeList
	if err := cfg.Client().Resources().List(ctx, &nodes, resources.WithLabelSelector(harness.RealNodeLabel+"="+harness.RealNodeValue)); err != nil || len(nodes.Items) == 0 {
		b.Skipf("skipped: no real node (%v); this benchmark starts pods on the local cluster's real node", err)
	}
	if err := suite.LoadImages(ctx, "runner", "webhook"); err != nil {
		b.Fatal(err)
	}
	image, err := suite.ImageRef(ctx, "runner")
	if err != nil {
		b.Fatal(err)
	}
	ns := "bench-secrets-" + strings.ToLower(rand.Text()[:6])
	r := cfg.Client().Resources()
	if err := r.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		harness.LabelE2E: "true", runnerNamespaceLabel: "enabled",
	}}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = r.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	ctx = harness.WithNamespace(ctx, ns)

	v := startVault(ctx, b)
	const refs = 10
	policy := ""
	for i := range refs {
		if _, err := v.client.KVv2("secret").Put(ctx, fmt.Sprintf("s%d", i), map[string]any{"password": rand.Text()}); err != nil {
			b.Fatal(err)
		}
		policy += fmt.Sprintf("path \"secret/data/s%d\" { capabilities = [\"read\"] }\n", i)
	}
	v.runnerToken(ctx, b, cfg, ns, policy)
	startWebhookWith(ctx, b, cfg, fmt.Sprintf("secretStores:\n  vault: {enabled: true, address: %q, secretName: vault-token}\nsecretRefs: {allowedPatterns: [\"vault:bench:secret/**\"]}\n", v.addr))

	n := 0
	for _, withRefs := range []bool{false, true} {
		b.Run(fmt.Sprintf("refs=%d", map[bool]int{false: 0, true: refs}[withRefs]), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				n++
				j := &batchv1.Job{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("start-%d", n), Namespace: ns, Labels: map[string]string{"runwarden.dev/dispatcher": "bench"}},
					Spec: batchv1.JobSpec{BackoffLimit: ptr.To[int32](0), Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"runwarden.dev/runner": "true"}},
						Spec: corev1.PodSpec{
							RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](0),
							Containers: []corev1.Container{{Name: "main", Image: image, Command: []string{"/bin/sh", "-c", "true"}}},
						},
					}},
				}
				for i := range refs {
					value := fmt.Sprintf("value-%d", i)
					if withRefs {
						value = fmt.Sprintf("${vault:secret/s%d.password@bench}", i)
					}
					j.Spec.Template.Spec.Containers[0].Env = append(j.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("TF_VAR_s%d", i), Value: value})
				}
				harness.OnRealNode(&j.Spec.Template.Spec)
				start := time.Now()
				if err := r.Create(ctx, j); err != nil {
					b.Fatal(err)
				}
				started := func(ctx context.Context) (bool, error) {
					var pods corev1.PodList
					if err := r.WithNamespace(ns).List(ctx, &pods, resources.WithLabelSelector("job-name="+j.Name)); err != nil || len(pods.Items) == 0 {
						return false, nil
					}
					p := pods.Items[0]
					for _, s := range p.Status.InitContainerStatuses {
						if t := s.State.Terminated; t != nil && t.ExitCode != 0 {
							return false, fmt.Errorf("init container %s failed: %s", s.Name, t.Message)
						}
					}
					for _, s := range p.Status.ContainerStatuses {
						if s.Name == "main" && (s.State.Running != nil || s.State.Terminated != nil) {
							return true, nil
						}
					}
					return false, nil
				}
				if err := harness.WaitForEvery(ctx, "the runner container to start", 2*time.Minute, 20*time.Millisecond, started); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
				_ = r.Delete(ctx, j, resources.WithDeletePropagation(string(metav1.DeletePropagationBackground)))
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/start")
		})
	}
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// warningsSeen collects the admission warnings the API server sends a client.
type warningsSeen struct {
	mu   sync.Mutex
	list []string
}

// HandleWarningHeader implements rest.WarningHandler.
func (w *warningsSeen) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warningsSeen) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

// TestWebhookRuleEnforcement runs the webhook with the platform's action per
// rule (docs/policy.md) on the real API server: a rule in dryrun admits the
// pods that break it with no warning, and the webhook counts them
// (runwarden_webhook_denials_total{action="dryrun"}) and logs them; a rule in
// warn admits them with the warning (the client's, and the runner pod's
// record); a namespace's deny beats the rule's dryrun; and annotations the
// namespace's tenants write relax nothing.
func TestWebhookRuleEnforcement(t *testing.T) {
	t.Parallel()
	f := features.New("rule enforcement").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			// What a tenant of the namespace could write, trying to relax the
			// rules on itself.
			n := &corev1.Namespace{}
			if err := cfg.Client().Resources().Get(ctx, ns, "", n); err != nil {
				t.Fatal(err)
			}
			n.Annotations = map[string]string{
				"runwarden.dev/enforcement":                    "dryrun",
				"runwarden.dev/enforcement.no-host-namespaces": "dryrun",
				"runwarden.dev/mode":                           "audit",
			}
			if err := cfg.Client().Resources().Update(ctx, n); err != nil {
				t.Fatal(err)
			}
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: ns}}
			if err := cfg.Client().Resources().Create(ctx, sa); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("dryrun admits silently and counts, warn admits with the warning, the namespace's deny wins", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			w := startWebhookWith(ctx, t, cfg, webhookPlatformConfig+fmt.Sprintf(`
enforcement:
  rules:
    no-privileged: dryrun
    no-host-path: warn
    no-host-namespaces: dryrun
  namespaces:
    %s:
      no-host-namespaces: deny
`, ns))
			// A client that keeps the warnings the API server sends it.
			seen := &warningsSeen{}
			rc := rest.CopyConfig(cfg.Client().RESTConfig())
			rc.WarningHandler = seen
			cs, err := kubernetes.NewForConfig(rc)
			if err != nil {
				t.Fatal(err)
			}
			counted := func(rule, action string, want int) {
				t.Helper()
				line := fmt.Sprintf(`runwarden_webhook_denials_total{action=%q,rule=%q} %d`, action, rule, want)
				has := func(context.Context) (bool, error) {
					return strings.Contains(w.metric(t, "runwarden_webhook_denials_total"), line), nil
				}
				if err := harness.WaitFor(ctx, line, 10*time.Second, has); err != nil {
					t.Errorf("%v; the webhook's metrics:\n%s", err, w.metric(t, "runwarden_webhook_denials_total"))
				}
			}

			// dryrun: the runner pod is made as if the rule did not exist,
			// with no warning in its record; the webhook counts it once and
			// logs it.
			pod, failure := jobPod(ctx, t, cfg, runnerJobFor(ns, "privileged-dryrun", true))
			if pod == nil {
				t.Fatalf("a privileged runner pod with no-privileged in dryrun: %s\nwebhook log:\n%s", failure, w.log.String())
			}
			if got := pod.Annotations["runwarden.dev/warnings"]; got != "" {
				t.Errorf("runner pod %s records warnings %q, want none in dryrun", pod.Name, got)
			}
			counted("no-privileged", "dryrun", 1)
			if !dryrunLogged(w.log.String(), "no-privileged", ns, pod.Name) {
				t.Errorf("no dryrun log line for rule no-privileged, namespace %s, pod %s:\n%s", ns, pod.Name, w.log.String())
			}
			// A pod a user creates: admitted, and the user is told nothing.
			plain := runnerPodFor(ns, "privileged-plain", true)
			plain.Labels = map[string]string{"app": "tool"}
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, plain, metav1.CreateOptions{}); err != nil {
				t.Errorf("a privileged pod with no-privileged in dryrun was refused: %v", err)
			}
			if got := seen.take(); len(got) != 0 {
				t.Errorf("warnings %q for a rule in dryrun, want none", got)
			}
			counted("no-privileged", "dryrun", 2)

			// warn: admitted, with the warning, to the user and in the
			// runner pod's record.
			hostPath := corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/log"}}}
			job := runnerJobFor(ns, "host-path-warn", false)
			job.Spec.Template.Spec.Volumes = []corev1.Volume{hostPath}
			pod, failure = jobPod(ctx, t, cfg, job)
			if pod == nil {
				t.Fatalf("a runner pod with a host path and no-host-path in warn: %s\nwebhook log:\n%s", failure, w.log.String())
			}
			if got := pod.Annotations["runwarden.dev/warnings"]; !strings.Contains(got, `audit: would deny: no-host-path: volume "host" mounts a host path`) {
				t.Errorf("runner pod %s records warnings %q, want the no-host-path warning", pod.Name, got)
			}
			withHostPath := runnerPodFor(ns, "host-path-plain", false)
			withHostPath.Labels = map[string]string{"app": "tool"}
			withHostPath.Spec.Volumes = []corev1.Volume{hostPath}
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, withHostPath, metav1.CreateOptions{}); err != nil {
				t.Errorf("a pod with a host path and no-host-path in warn was refused: %v", err)
			}
			if got := seen.take(); len(got) != 1 || !strings.Contains(got[0], `no-host-path: volume "host" mounts a host path`) {
				t.Errorf("warnings %q, want the no-host-path warning", got)
			}
			counted("no-host-path", "warn", 2)

			// The namespace's deny beats the rule's dryrun, whatever the
			// namespace's own annotations say.
			hostPID := runnerPodFor(ns, "host-pid", false)
			hostPID.Labels = map[string]string{"app": "tool"}
			hostPID.Spec.HostPID = true
			_, err = cs.CoreV1().Pods(ns).Create(ctx, hostPID, metav1.CreateOptions{})
			if err == nil || !strings.Contains(err.Error(), "no-host-namespaces: the pod uses the host's namespaces (hostPID)") {
				t.Errorf("a hostPID pod with the namespace's deny: error %v, want the no-host-namespaces denial", err)
			}
			counted("no-host-namespaces", "deny", 1)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// dryrunLogged tells whether the webhook's JSON log has the dryrun line of
// a rule for a pod.
func dryrunLogged(log, rule, ns, pod string) bool {
	for _, l := range strings.Split(log, "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(l), &e) != nil {
			continue
		}
		msg, _ := e["message"].(string)
		if e["msg"] == "policy violation in dryrun, pod admitted" && e["rule"] == rule && e["namespace"] == ns && e["pod"] == pod &&
			strings.HasPrefix(msg, rule+": ") {
			return true
		}
	}
	return false
}

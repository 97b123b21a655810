//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/k8s/resources"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/e2e/harness"
)

// webhookPlatformConfig is the platform configuration the e2e webhook runs with.
const webhookPlatformConfig = `
workloadIdentity:
  aws: {enabled: true}
secretStores:
  vault: {enabled: true, address: "https://vault.example:8200", secretName: vault-token}
secretRefs:
  allowedPatterns: ["vault:team-a:secret/**"]
scheduling:
  nodeSelector: {runwarden.dev/pool: runner}
  tolerations:
  - {key: runwarden.dev/pool, operator: Equal, value: runner, effect: NoSchedule}
  requiredNodeAffinity:
  - {key: kubernetes.io/os, operator: In, values: [linux]}
`

// runnerNamespaceLabel is the label the chart's webhook configurations once
// required of the runner namespace; they select it by name alone, as the e2e
// webhook does (TestSecurityNamespaceLabelIsNoSwitch).
const runnerNamespaceLabel = "runwarden.dev/runners"

// webhookProcess is runwarden-webhook running on the host, registered with
// the API server by URL, as the chart's dev mode does.
type webhookProcess struct {
	cmd       *exec.Cmd
	log       *harness.LockedBuffer
	policyDir string
	// bin is the built runwarden-webhook; platform its --config file.
	bin        string
	platform   string
	healthAddr string
	metrics    string
	config     string
}

// handedOut holds every port freePort returned in this run: the kernel may
// give a port that was free a moment ago again (it did: one webhook got the
// same port for its webhook server and its health probe, and exited), and a
// process started later has not bound it yet.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort returns a loopback TCP port that is free now and that it has
// returned to no one else in this run.
func freePort(t testing.TB) int {
	t.Helper()
	return freePortOn(t, "127.0.0.1")
}

// freePortOn returns a TCP port of host that is free now and that no call
// of freePort or freePortOn has returned before in this run (tests run side
// by side, each starting its own servers).
func freePortOn(t testing.TB, host string) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("finding a free port on %s: %v", host, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		handedOut.Lock()
		taken := handedOut.ports[port]
		handedOut.ports[port] = true
		handedOut.Unlock()
		if !taken {
			return port
		}
	}
	t.Fatalf("found no port of %s not handed out before in 100 tries", host)
	return 0
}

// validateOnly labels a runner pod that only the ValidatingWebhookConfiguration
// sees, as a pod another mutating webhook changed after this one's last pass.
const validateOnly = "e2e.runwarden.dev/validate-only"

// startWebhook builds and starts the webhook and registers a
// MutatingWebhookConfiguration and a ValidatingWebhookConfiguration for it
// (the mutating one leaves out pods labelled validateOnly); the webhook
// fills in their caBundles.
func startWebhook(ctx context.Context, t *testing.T, cfg *envconf.Config, extraArgs ...string) *webhookProcess {
	t.Helper()
	return startWebhookWith(ctx, t, cfg, webhookPlatformConfig, extraArgs...)
}

// startWebhookWith starts the webhook with the given platform configuration.
func startWebhookWith(ctx context.Context, t testing.TB, cfg *envconf.Config, platform string, extraArgs ...string) *webhookProcess {
	t.Helper()
	dir := t.TempDir()
	bin := built.build(ctx, t, suite.RepoRoot, "./webhook")
	w := &webhookProcess{log: &harness.LockedBuffer{}, policyDir: filepath.Join(dir, "policies"), bin: bin, platform: filepath.Join(dir, "platform.yaml")}
	if err := os.CopyFS(w.policyDir, os.DirFS(filepath.Join(suite.RepoRoot, "policies"))); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(w.policyDir, "embed.go")); err != nil {
		t.Fatal(err)
	}
	cfgFile := w.platform
	if err := os.WriteFile(cfgFile, []byte(platform), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	w.healthAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	w.metrics = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	// One configuration per namespace, named after it.
	w.config = "runwarden-" + harness.Namespace(ctx)

	rules := []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}
	// As the chart's: its runner namespace only (the feature's), so that
	// the webhooks of tests running side by side never see each other's
	// pods.
	namespaces := &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{harness.Namespace(ctx)},
		}, {
			Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "runwarden"},
		}},
	}
	runners := map[string]string{"runwarden.dev/runner": "true"}
	whc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: w.config},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pods.runwarden.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d/mutate-pods", port))},
			Rules:                   rules,
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](5),
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
			AdmissionReviewVersions: []string{"v1"},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: runners, MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: validateOnly, Operator: metav1.LabelSelectorOpDoesNotExist,
			}}},
			NamespaceSelector: namespaces,
		}},
	}
	// As the chart's: every pod of the namespace, every way to change one,
	// and every way into a running one.
	validateRules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods", "pods/ephemeralcontainers", "pods/resize"}},
	}, {
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Connect},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods/exec", "pods/attach", "pods/portforward"}},
	}}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: w.config},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "pods.runwarden.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d/validate-pods", port))},
			Rules:                   validateRules,
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To[int32](5),
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       namespaces,
			MatchConditions:         chartMatchConditions(t),
		}},
	}
	for _, c := range []k8s.Object{whc, vwc} {
		if err := cfg.Client().Resources().Create(ctx, c); err != nil {
			t.Fatalf("creating the webhook configuration: %v", err)
		}
		t.Cleanup(func() {
			_ = cfg.Client().Resources().Delete(context.Background(), c)
		})
	}

	resolver, err := suite.ImageRef(ctx, "webhook")
	if err != nil {
		t.Fatal(err)
	}
	w.cmd = exec.Command(bin, append([]string{"serve",
		"--resolver-image", resolver, "--resolver-image-pull-policy", "Never",
		"--bind-address", "127.0.0.1", "--port", fmt.Sprint(port),
		"--cert-dir", filepath.Join(dir, "certs"), "--cert-mode", "self", "--cert-hosts", "127.0.0.1",
		"--mutating-webhook-configuration", w.config, "--validating-webhook-configuration", w.config,
		"--policies", w.policyDir, "--policy-reload-interval", "500ms",
		"--config", cfgFile,
		"--metrics-bind-address", w.metrics, "--health-probe-bind-address", w.healthAddr,
		"--kubeconfig", cfg.KubeconfigFile()}, extraArgs...)...)
	w.cmd.Stdout, w.cmd.Stderr = w.log, w.log
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.stop() })
	ready := func(ctx context.Context) (bool, error) {
		if w.cmd.ProcessState != nil {
			return false, fmt.Errorf("the webhook exited: %s", w.log.String())
		}
		resp, err := http.Get("http://" + w.healthAddr + "/readyz")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, nil
		}
		mutating := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := cfg.Client().Resources().Get(ctx, w.config, "", mutating); err != nil {
			return false, err
		}
		validating := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := cfg.Client().Resources().Get(ctx, w.config, "", validating); err != nil {
			return false, err
		}
		return len(mutating.Webhooks[0].ClientConfig.CABundle) > 0 && len(validating.Webhooks[0].ClientConfig.CABundle) > 0, nil
	}
	if err := harness.WaitFor(ctx, "the webhook to serve and publish its CA in both configurations", 60*time.Second, ready); err != nil {
		t.Fatalf("%v\nwebhook log:\n%s", err, w.log.String())
	}
	return w
}

func (w *webhookProcess) stop() {
	if w.cmd.Process != nil && w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Signal(os.Interrupt)
		_, _ = w.cmd.Process.Wait()
	}
}

func (w *webhookProcess) metric(t *testing.T, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + w.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// chartMatchConditions are the validating webhook's matchConditions as the
// chart renders them, so the real API server compiles and runs the chart's
// own CEL.
func chartMatchConditions(t testing.TB) []admissionregistrationv1.MatchCondition {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(suite.RepoRoot, "charts", "runwarden", "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	// The Job controller's users, as the chart renders its default
	// webhook.jobControllerUsers: the webhook's default
	// --job-controller-users, which the e2e webhook runs with.
	s := strings.ReplaceAll(string(b), "{{ toJson $values.jobControllerUsers }}",
		`["system:serviceaccount:kube-system:job-controller","system:kube-controller-manager"]`)
	start := strings.Index(s, "matchConditions:\n")
	end := strings.Index(s[start:], "{{- else }}")
	if start < 0 || end < 0 {
		t.Fatal("the chart's validating webhook has no matchConditions")
	}
	var doc struct {
		MatchConditions []admissionregistrationv1.MatchCondition `json:"matchConditions"`
	}
	if err := yaml.Unmarshal([]byte(s[start:start+end]), &doc); err != nil || len(doc.MatchConditions) == 0 {
		t.Fatalf("the chart's matchConditions: %v", err)
	}
	return doc.MatchConditions
}

// runnerJobFor is a Job as the dispatcher makes it (its labels), whose pod
// is runnerPodFor's: the Job controller makes the pod, so it earns the
// runner label.
func runnerJobFor(ns, name string, privileged bool) *batchv1.Job {
	p := runnerPodFor(ns, name, privileged)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"runwarden.dev/dispatcher": "e2e"}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template:     corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels}, Spec: p.Spec},
		},
	}
}

// jobPod creates j and waits until its pod exists (returned) or the Job
// controller reports that it could not create it (the message returned).
func jobPod(ctx context.Context, t *testing.T, cfg *envconf.Config, j *batchv1.Job) (*corev1.Pod, string) {
	t.Helper()
	r := cfg.Client().Resources(j.Namespace)
	if err := r.Create(ctx, j); err != nil {
		t.Fatalf("creating Job %s: %v", j.Name, err)
	}
	var pod *corev1.Pod
	var failure string
	made := func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := r.List(ctx, &pods, resources.WithLabelSelector("job-name="+j.Name)); err == nil && len(pods.Items) > 0 {
			pod = &pods.Items[0]
			return true, nil
		}
		failure, _ = failedCreate(ctx, cfg, j.Namespace, j.Name)
		return failure != "", nil
	}
	if err := harness.WaitFor(ctx, "the pod of Job "+j.Name, 2*time.Minute, made); err != nil {
		t.Fatal(err)
	}
	return pod, failure
}

func runnerPodFor(ns, name string, privileged bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"runwarden.dev/runner": "true"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "runner",
			RestartPolicy:      corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox:stable", Command: []string{"true"},
				Env: []corev1.EnvVar{{Name: "DB_PASSWORD", Value: "${vault:secret/db.password@team-a}"}},
			}},
		},
	}
	if privileged {
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	return p
}

func envOf(p *corev1.Pod) map[string]string {
	return containerEnv(p.Spec.Containers[0])
}

// containerEnv is a container's env as name: value, a Secret's key as
// "secret:<name>/<key>", an env file's as "file:<volume>/<path>#<key>".
func containerEnv(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			m[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom != nil && e.ValueFrom.FileKeyRef != nil:
			f := e.ValueFrom.FileKeyRef
			m[e.Name] = "file:" + f.VolumeName + "/" + f.Path + "#" + f.Key
		}
	}
	return m
}

// TestWebhookShapesRunnerPods registers the webhook by URL with the real API
// server and checks what a user of the cluster sees.
func TestWebhookShapesRunnerPods(t *testing.T) {
	t.Parallel()
	f := features.New("webhook shapes runner pods").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources()
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			// As the chart's runner service account: no API token mounted.
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: ns, Annotations: map[string]string{
				"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runner",
			}}, AutomountServiceAccountToken: ptr.To(false)}
			if err := r.Create(ctx, sa); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("runner pods get credentials, identity and placement; tasks of one template share a decision; others are untouched; rule breakers are refused; a broken policy changes nothing, nor does a slow one (stopped at the deadline, an Event on the pod); after SIGTERM it serves on, not ready, for its shutdown delay; without the webhook runner pods are refused", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			const shutdownDelay = 10 * time.Second
			// The webhook runs on the host, not in a pod: it reports its
			// reloads on a pod name of the test's namespace, as the chart's
			// downward API would have it report on its own.
			w := startWebhook(ctx, t, cfg, "--shutdown-delay", shutdownDelay.String(),
				"--pod-name", "webhook-e2e", "--pod-namespace", ns)

			checkShaped := func(name string, extra ...corev1.EnvVar) {
				t.Helper()
				j := runnerJobFor(ns, name, false)
				c := &j.Spec.Template.Spec.Containers[0]
				c.Env = append(c.Env, extra...)
				pod, failure := jobPod(ctx, t, cfg, j)
				if pod == nil {
					t.Fatalf("runner Job %s got no pod: %s\nwebhook log:\n%s", name, failure, w.log.String())
				}
				env := envOf(pod)
				for k, v := range map[string]string{
					"AWS_ROLE_ARN":                "arn:aws:iam::111122223333:role/runner",
					"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
					"DB_PASSWORD":                 "file:runwarden-secrets/secrets.env#RW_0",
					"VAULT_ADDR":                  "",
					"VAULT_TOKEN":                 "",
				} {
					if env[k] != v {
						t.Errorf("pod %s env %s = %q, want %q", name, k, env[k], v)
					}
				}
				// The store's credentials go to the resolver alone.
				if len(pod.Spec.InitContainers) == 0 || pod.Spec.InitContainers[0].Name != "runwarden-secrets" {
					t.Fatalf("pod %s has no resolver init container: %+v", name, pod.Spec.InitContainers)
				}
				resolver := containerEnv(pod.Spec.InitContainers[0])
				if resolver["VAULT_ADDR"] != "https://vault.example:8200" || resolver["VAULT_TOKEN"] != "secret:vault-token/token" || resolver["RUNWARDEN_SECRET_REFS"] == "" {
					t.Errorf("pod %s resolver env %v, want Vault's address, token and the plan", name, resolver)
				}
				if pod.Spec.NodeSelector["runwarden.dev/pool"] != "runner" {
					t.Errorf("pod %s nodeSelector %v", name, pod.Spec.NodeSelector)
				}
				if len(pod.Spec.Tolerations) == 0 || pod.Spec.Affinity == nil || pod.Spec.Affinity.NodeAffinity == nil {
					t.Errorf("pod %s lacks the runner pool toleration or affinity: %+v %+v", name, pod.Spec.Tolerations, pod.Spec.Affinity)
				}
				found := false
				for _, v := range pod.Spec.Volumes {
					if v.Name == "aws-iam-token" && v.Projected != nil && v.Projected.Sources[0].ServiceAccountToken.Audience == "sts.amazonaws.com" {
						found = true
					}
				}
				if !found {
					t.Errorf("pod %s has no aws-iam-token projected volume: %+v", name, pod.Spec.Volumes)
				}
			}
			// decisions is the webhook's count of decisions from source.
			decisions := func(source string) float64 {
				t.Helper()
				text := w.metric(t, "runwarden_webhook_policy_decisions_total")
				for _, l := range strings.Split(text, "\n") {
					if strings.Contains(l, `source="`+source+`"}`) {
						v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
						if err != nil {
							t.Fatalf("%q: %v", l, err)
						}
						return v
					}
				}
				t.Fatalf("no decisions from %s in the metrics:\n%s", source, text)
				return 0
			}
			checkShaped("runner-1", corev1.EnvVar{Name: "DEPLOY_REF", Value: "task-1"})
			// A second task of the template, its variable's value its own:
			// both webhooks answer its pod from the first one's decisions
			// (the cache keys on what the policies read of the containers,
			// not on the variables' values). The first pod's update when it
			// ends (the Job controller's finalizer) may be evaluated
			// meanwhile: only the decisions from the cache are counted.
			cached, evaluated := decisions("cache"), decisions("evaluation")
			checkShaped("runner-1b", corev1.EnvVar{Name: "DEPLOY_REF", Value: "task-1b"})
			if got := decisions("cache"); got < cached+2 {
				t.Errorf("the second task's pod: decisions from the cache %v -> %v (evaluations %v -> %v), want its two (mutating, validating) from the cache\nwebhook log:\n%s",
					cached, got, evaluated, decisions("evaluation"), w.log.String())
			}

			// A pod that breaks a rule is refused, and the Job's events say
			// which rule.
			if _, failure := jobPod(ctx, t, cfg, runnerJobFor(ns, "privileged", true)); !strings.Contains(failure, "no-privileged") || !strings.Contains(failure, `container \"main\"`) && !strings.Contains(failure, `container "main"`) {
				t.Errorf("privileged runner pod: %q, want a denial naming rule no-privileged and container main", failure)
			}
			// A pod that claims the runner label without a dispatcher's Job
			// behind it gets nothing.
			err := r.Create(ctx, runnerPodFor(ns, "claimed", false))
			if err == nil || !strings.Contains(err.Error(), "claims the label runwarden.dev/runner") {
				t.Errorf("a runner pod created directly: error %v, want the refusal of its claim", err)
			}

			// The validating configuration checks the pod as it will be
			// stored: one changed after the mutating webhook's last pass (here,
			// one it never saw) is refused if it breaks a rule, and admitted
			// unchanged if not.
			late := runnerJobFor(ns, "privileged-late", true)
			late.Spec.Template.Labels[validateOnly] = "true"
			if _, failure := jobPod(ctx, t, cfg, late); !strings.Contains(failure, "no-privileged") {
				t.Errorf("privileged runner pod seen only by the validating webhook: %q, want a denial naming rule no-privileged", failure)
			}
			unshapedJob := runnerJobFor(ns, "validated-only", false)
			unshapedJob.Spec.Template.Labels[validateOnly] = "true"
			if unshaped, failure := jobPod(ctx, t, cfg, unshapedJob); unshaped == nil {
				t.Errorf("a runner pod that breaks no rule, seen only by the validating webhook: %s", failure)
			} else if _, ok := envOf(unshaped)["AWS_ROLE_ARN"]; ok {
				t.Errorf("the validating webhook changed a pod: env %v", envOf(unshaped))
			}

			// A pod that is not a runner pod is untouched, but checked:
			// the shape rules apply to every pod of a runner namespace.
			plain := runnerPodFor(ns, "not-a-runner", false)
			plain.Labels = map[string]string{"app": "web"}
			if err := r.Create(ctx, plain); err != nil {
				t.Fatalf("non-runner pod refused: %v", err)
			}
			if _, ok := envOf(plain)["AWS_ROLE_ARN"]; ok || plain.Spec.NodeSelector != nil {
				t.Errorf("non-runner pod was mutated: env %v, nodeSelector %v", envOf(plain), plain.Spec.NodeSelector)
			}
			privilegedPlain := runnerPodFor(ns, "privileged-not-a-runner", true)
			privilegedPlain.Labels = map[string]string{"app": "web"}
			if err := r.Create(ctx, privilegedPlain); err == nil || !strings.Contains(err.Error(), "no-privileged") {
				t.Errorf("a privileged pod without the runner label: error %v, want the no-privileged denial", err)
			}

			// A broken policy pushed at runtime is refused; the last good set stays.
			if err := os.WriteFile(filepath.Join(w.policyDir, "broken.rego"), []byte("package runwarden.admission\n\ndecision := {\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			refused := func(context.Context) (bool, error) {
				return strings.Contains(w.metric(t, "runwarden_webhook_policy_reloads_total"), `result="failure"`), nil
			}
			if err := harness.WaitFor(ctx, "the broken policy to be refused", 30*time.Second, refused); err != nil {
				t.Fatalf("%v\nwebhook log:\n%s", err, w.log.String())
			}
			// A set whose test loops 10^10 times is stopped at the deadline
			// and refused: reloads go on, the last good set stays, and an
			// Event on the webhook's pod says why.
			if err := os.Remove(filepath.Join(w.policyDir, "broken.rego")); err != nil {
				t.Fatal(err)
			}
			slow := "package runwarden.slow_test\n\ntest_slow if count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)]) > 0\n"
			if err := os.WriteFile(filepath.Join(w.policyDir, "slow_test.rego"), []byte(slow), 0o644); err != nil {
				t.Fatal(err)
			}
			timedOut := func(ctx context.Context) (bool, error) {
				if !strings.Contains(w.metric(t, "runwarden_webhook_policy_reload_timeouts_total"), "runwarden_webhook_policy_reload_timeouts_total 1") {
					return false, nil
				}
				var events corev1.EventList
				if err := r.List(ctx, &events); err != nil {
					return false, err
				}
				for _, e := range events.Items {
					if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == "webhook-e2e" && e.Type == corev1.EventTypeWarning &&
						e.Reason == "PolicyReloadRefused" && strings.Contains(e.Message, "test_slow") && strings.Contains(e.Message, "ran past the deadline of 30s") {
						return true, nil
					}
				}
				return false, nil
			}
			if err := harness.WaitFor(ctx, "the slow policy to be refused with a Warning Event on the webhook's pod", 2*time.Minute, timedOut); err != nil {
				t.Fatalf("%v\nwebhook log:\n%s", err, w.log.String())
			}
			checkShaped("runner-2")

			// On SIGTERM (a rolling update, a node drain) the API server still
			// calls the pod until the endpoint change reaches it: the webhook
			// stops being ready but admits runner pods for its shutdown delay,
			// then exits by itself.
			if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- w.cmd.Wait() }()
			notReady := func(context.Context) (bool, error) {
				resp, err := http.Get("http://" + w.healthAddr + "/readyz")
				if err != nil {
					return false, fmt.Errorf("/readyz during the shutdown delay: %w", err)
				}
				_ = resp.Body.Close()
				return resp.StatusCode != http.StatusOK, nil
			}
			if err := harness.WaitFor(ctx, "/readyz to fail after SIGTERM", shutdownDelay/2, notReady); err != nil {
				t.Fatalf("%v\nwebhook log:\n%s", err, w.log.String())
			}
			checkShaped("runner-3")
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("the webhook exited with %v after SIGTERM\nwebhook log:\n%s", err, w.log.String())
				}
			case <-time.After(shutdownDelay + 30*time.Second):
				t.Fatalf("the webhook still runs %s after SIGTERM\nwebhook log:\n%s", shutdownDelay+30*time.Second, w.log.String())
			}

			// With the webhook stopped, the pods of the runner namespace are
			// refused (failurePolicy Fail), and those of other namespaces are
			// still admitted.
			if pod, failure := jobPod(ctx, t, cfg, runnerJobFor(ns, "runner-4", false)); pod != nil || !strings.Contains(failure, "failed calling webhook") {
				t.Errorf("a runner pod with the webhook down: pod %v, %q; want it refused as a failed call", pod != nil, failure)
			}
			plain2 := runnerPodFor("default", "not-a-runner-"+ns[len(ns)-6:], false)
			plain2.Labels = map[string]string{"app": "web"}
			plain2.Spec.ServiceAccountName = ""
			if err := cfg.Client().Resources("default").Create(ctx, plain2); err != nil {
				t.Errorf("a pod of another namespace was refused with the webhook down: %v", err)
			}
			_ = cfg.Client().Resources("default").Delete(ctx, plain2)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

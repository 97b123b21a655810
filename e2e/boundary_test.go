//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/e2e/harness"
)

// The credentials boundary (docs/policy.md, boundary rules), on the real
// API server, each refusal as the user who tries it, with only that user's
// RBAC, and under a platform that relaxes every rule it can.

// boundaryValues are the chart values of the boundary's tests: the runner
// service account is the e2e one ("runner"), the Vault store uses
// Kubernetes auth (its token's audience, "vault", is the platform's) and
// names the vault-token Secret, a credential set names git-creds, and IRSA
// is on (sts.amazonaws.com). auditMode and enforcement are the ways they
// relax every rule.
func boundaryValues(auditMode bool, enforcement string) string {
	return fmt.Sprintf(`
runner:
  serviceAccount: {name: runner}
webhook:
  auditMode: %t
  platform:
    enforcement: %s
    workloadIdentity:
      aws: {enabled: true}
    secretStores:
      vault: {enabled: true, address: "https://vault.example:8200", auth: kubernetes, role: runner, secretName: vault-token}
    credentialSets:
    - {name: git, secretName: git-creds, mountPath: /git}
    secretRefs:
      allowedPatterns: ["vault:team-a:secret/**"]
`, auditMode, enforcement)
}

// chartPlatformConfig renders the chart with values and returns the
// platform configuration it gives the webhook (the ConfigMap
// <release>-platform): the mode from auditMode, and the runner service
// account and pod template Secrets the chart adds.
func chartPlatformConfig(ctx context.Context, t *testing.T, cfg *envconf.Config, values string) string {
	t.Helper()
	ns := harness.Namespace(ctx)
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := newHelm(t, cfg, "helm3").run(ctx, "template", "rw-"+ns[len(ns)-6:], filepath.Join(suite.RepoRoot, "charts", "runwarden"),
		"--namespace", "runwarden", "-f", file, "--show-only", "templates/configmaps.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(out, "\n---\n") {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			t.Fatal(err)
		}
		if p, ok := cm.Data["platform.yaml"]; ok {
			return p
		}
	}
	t.Fatalf("the chart rendered no platform configuration:\n%s", out)
	return ""
}

// boundaryUser is a user of the runner namespace with ordinary rights:
// pods (ephemeral containers included) and service accounts, to create,
// change and annotate.
func boundaryUser(ctx context.Context, t *testing.T, cfg *envconf.Config) (harness.User, client.Client) {
	t.Helper()
	ns := harness.Namespace(ctx)
	u := harness.User{Name: "tenant-" + ns[len(ns)-6:]}
	if err := u.Grant(ctx, cfg, ns, "tenant", rbacv1.PolicyRule{
		APIGroups: []string{""}, Resources: []string{"pods", "pods/ephemeralcontainers"},
		Verbs: []string{"get", "list", "create", "update", "patch"},
	}, rbacv1.PolicyRule{
		APIGroups: []string{""}, Resources: []string{"serviceaccounts"},
		Verbs: []string{"get", "list", "update", "patch"},
	}); err != nil {
		t.Fatal(err)
	}
	c, err := u.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return u, c
}

// boundarySetup labels the feature's namespace for the webhook and creates
// the runner service account and another one.
func boundarySetup(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
	if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"runner", "tool"} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: harness.Namespace(ctx)}}
		if err := cfg.Client().Resources().Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
	}
	return ctx
}

// plainPod is a pod without the runner label, as the service account
// "tool" runs it.
func plainPod(ns, name string, change func(*corev1.PodSpec)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "tool"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "tool",
			RestartPolicy:      corev1.RestartPolicyNever,
			Containers:         []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"true"}}},
		},
	}
	change(&p.Spec)
	return p
}

// debugRunner adds, as c's user, a debug container that mounts the
// resolved-secrets volume of runner and targets main (kubectl debug
// --target main, with a custom profile), and returns the API server's
// answer.
func debugRunner(ctx context.Context, t *testing.T, c client.Client, runner *corev1.Pod) error {
	t.Helper()
	current := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(runner), current); err != nil {
		t.Fatal(err)
	}
	before := current.DeepCopy()
	current.Spec.EphemeralContainers = append(current.Spec.EphemeralContainers, corev1.EphemeralContainer{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debugger", Image: "busybox:stable", Command: []string{"cat", "/s/secrets.env"},
			VolumeMounts: []corev1.VolumeMount{{Name: "runwarden-secrets", MountPath: "/s"}},
		},
		TargetContainerName: "main",
	})
	return c.SubResource("ephemeralcontainers").Patch(ctx, current, client.MergeFrom(before))
}

// boundaryRunner makes a runner Job as the dispatcher would and returns the
// pod the Job controller made for it, checking it holds the resolved-secrets
// volume a debug container would mount.
func boundaryRunner(ctx context.Context, t *testing.T, cfg *envconf.Config, w *webhookProcess, name string) *corev1.Pod {
	t.Helper()
	runner, failure := jobPod(ctx, t, cfg, runnerJobFor(harness.Namespace(ctx), name, false))
	if runner == nil {
		t.Fatalf("the runner Job's pod: %s\nwebhook log:\n%s", failure, w.log.String())
	}
	for _, v := range runner.Spec.Volumes {
		if v.Name == "runwarden-secrets" {
			return runner
		}
	}
	t.Fatalf("the runner pod has no resolved-secrets volume: %+v", runner.Spec.Volumes)
	return nil
}

// TestBoundaryInAuditMode: with the chart's auditMode (every rule warns),
// a tenant of the runner namespace who may create pods and annotate
// service accounts gets none of the platform's credentials: a plain pod
// that reads the Vault store's Secret (secretKeyRef), mounts a credential
// set's Secret, runs as the runner service account or holds a token of the
// Vault role's or IRSA's audience is refused, naming the field; a plain pod
// without them is admitted (the refusals are the boundary's, not the
// shape's). A debug container that mounts a runner's resolved values is
// refused. The runner service account annotated with the Vault role's
// audience leaves runners without that token: their pods are refused,
// naming the annotation.
func TestBoundaryInAuditMode(t *testing.T) {
	t.Parallel()
	f := features.New("credentials boundary in audit mode").
		Setup(boundarySetup).
		Assess("the platform's credentials reach runner pods alone", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			platform := chartPlatformConfig(ctx, t, cfg, boundaryValues(true, "{}"))
			for _, want := range []string{"mode: audit", "serviceAccount: runner", "secretName: vault-token"} {
				if !strings.Contains(platform, want) {
					t.Fatalf("the chart's platform configuration lacks %q:\n%s", want, platform)
				}
			}
			w := startWebhookWith(ctx, t, cfg, platform)
			_, c := boundaryUser(ctx, t, cfg)

			token := func(audience string) func(*corev1.PodSpec) {
				return func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
						ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: audience, ExpirationSeconds: ptr.To[int64](600), Path: "t"},
					}}}}}}
					s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "tok", MountPath: "/t"}}
				}
			}
			for _, tc := range []struct {
				name   string
				change func(*corev1.PodSpec)
				want   []string // in the refusal; none: admitted
			}{
				{name: "own", change: func(s *corev1.PodSpec) {
					s.Containers[0].Env = []corev1.EnvVar{{Name: "T", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "own"}, Key: "t"}}}}
					token("my-app")(s)
				}},
				{name: "vault-token-env", want: []string{"platform-secret", "spec.containers[main].env[VAULT_TOKEN].valueFrom.secretKeyRef.name", `Secret "vault-token"`}, change: func(s *corev1.PodSpec) {
					s.Containers[0].Env = []corev1.EnvVar{{Name: "VAULT_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "vault-token"}, Key: "token"}}}}
				}},
				{name: "git-creds-volume", want: []string{"platform-secret", "spec.volumes[g].secret.secretName", `Secret "git-creds"`}, change: func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "g", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "git-creds"}}}}
				}},
				{name: "runner-sa", want: []string{"platform-service-account", "spec.serviceAccountName", `service account "runner"`}, change: func(s *corev1.PodSpec) {
					s.ServiceAccountName = "runner"
				}},
				{name: "vault-audience", want: []string{"platform-token-audience", "spec.volumes[tok].projected.sources[0].serviceAccountToken.audience", `audience "vault"`}, change: token("vault")},
				{name: "sts-audience", want: []string{"platform-token-audience", `audience "sts.amazonaws.com"`}, change: token("sts.amazonaws.com")},
			} {
				err := c.Create(ctx, plainPod(ns, "plain-"+tc.name, tc.change))
				if len(tc.want) == 0 {
					if err != nil {
						t.Errorf("a plain pod with its own Secret and token: %v", err)
					}
					continue
				}
				if err == nil {
					t.Errorf("a plain pod (%s) was admitted in audit mode, want refused naming %q", tc.name, tc.want)
					continue
				}
				for _, want := range tc.want {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("a plain pod (%s): %v; want the refusal to name %q", tc.name, err, want)
					}
				}
			}

			runner := boundaryRunner(ctx, t, cfg, w, "runner-a")
			if err := debugRunner(ctx, t, c, runner); err == nil || !strings.Contains(err.Error(), "no-ephemeral-containers") {
				t.Errorf("a debug container mounting the resolved values, in audit mode: %v", err)
			}

			// The runner service account annotated, by the same tenant,
			// with an IRSA role whose token's audience is the Vault role's.
			sa := &corev1.ServiceAccount{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "runner"}, sa); err != nil {
				t.Fatal(err)
			}
			before := sa.DeepCopy()
			sa.Annotations = map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runner", "eks.amazonaws.com/audience": "vault"}
			if err := c.Patch(ctx, sa, client.MergeFrom(before)); err != nil {
				t.Fatalf("annotating the runner service account as the tenant: %v", err)
			}
			// The webhook reads service accounts from its cache: a runner
			// made before the cache holds the annotation gets no IRSA at
			// all, and another is made. One made with it is refused, or
			// (the defect) admitted with the Vault role's token.
			attempt := 0
			refused := func(ctx context.Context) (bool, error) {
				attempt++
				pod, failure := jobPod(ctx, t, cfg, runnerJobFor(ns, fmt.Sprintf("runner-b%d", attempt), false))
				if pod == nil {
					if !strings.Contains(failure, "identity-audience") || !strings.Contains(failure, "eks.amazonaws.com/audience") {
						return false, fmt.Errorf("the runner pod was refused with %q, want identity-audience naming the annotation", failure)
					}
					return true, nil
				}
				for _, v := range pod.Spec.Volumes {
					if v.Name == "aws-iam-token" {
						return false, fmt.Errorf("the runner pod was admitted with IRSA token volume %+v: the Vault role's audience reached main", v.Projected)
					}
				}
				return false, nil
			}
			if err := harness.WaitFor(ctx, "a runner pod of the annotated service account to be refused", 2*time.Minute, refused); err != nil {
				t.Errorf("%v\nwebhook log:\n%s", err, w.log.String())
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestBoundaryWithDryrunDefault: with enforcement.default dryrun (every
// rule admitted silently), a debug container that mounts a runner's
// resolved values, and a plain pod as the runner service account, are
// still refused.
func TestBoundaryWithDryrunDefault(t *testing.T) {
	t.Parallel()
	f := features.New("credentials boundary with a dryrun default").
		Setup(boundarySetup).
		Assess("debug containers and the runner service account are refused", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			platform := chartPlatformConfig(ctx, t, cfg, boundaryValues(false, "{default: dryrun}"))
			w := startWebhookWith(ctx, t, cfg, platform)
			_, c := boundaryUser(ctx, t, cfg)
			runner := boundaryRunner(ctx, t, cfg, w, "runner-a")
			if err := debugRunner(ctx, t, c, runner); err == nil || !strings.Contains(err.Error(), "no-ephemeral-containers") {
				t.Errorf("a debug container mounting the resolved values, with a dryrun default: %v", err)
			}
			err := c.Create(ctx, plainPod(ns, "plain-runner-sa", func(s *corev1.PodSpec) { s.ServiceAccountName = "runner" }))
			if err == nil || !strings.Contains(err.Error(), "platform-service-account") {
				t.Errorf("a plain pod as the runner service account, with a dryrun default: %v", err)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

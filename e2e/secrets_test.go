//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	vault "github.com/hashicorp/vault/api"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/e2e/harness"
)

// realNodeGateway is the real node's bridge gateway: the host, as its pods
// reach it (hack/node.sh).
const realNodeGateway = "10.88.0.1"

// vaultServer is a HashiCorp Vault dev server (the pinned one of
// hack/tools.sh), on the address runner pods on the real node reach the host
// by.
type vaultServer struct {
	addr, root string
	client     *vault.Client
	log        *strings.Builder
}

func startVault(ctx context.Context, t testing.TB) *vaultServer {
	t.Helper()
	out, err := exec.CommandContext(ctx, filepath.Join(suite.RepoRoot, "hack", "tools.sh"), "path", "vault").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh path vault: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	port := freePortOn(t, realNodeGateway)
	v := &vaultServer{addr: fmt.Sprintf("http://%s:%d", realNodeGateway, port), root: rand.Text(), log: &strings.Builder{}}
	cmd := exec.Command(filepath.Join(dir, "vault"), "server", "-dev", "-dev-root-token-id="+v.root, "-dev-listen-address="+fmt.Sprintf("%s:%d", realNodeGateway, port), "-dev-no-store-token",
		"-dev-plugin-dir="+filepath.Join(dir, "plugins"))
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "SKIP_SETCAP=1", "VAULT_DISABLE_MLOCK=true")
	cmd.Stdout, cmd.Stderr = v.log, v.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_, _ = cmd.Process.Wait()
	})
	cfg := vault.DefaultConfig()
	cfg.Address = v.addr
	if v.client, err = vault.NewClient(cfg); err != nil {
		t.Fatal(err)
	}
	v.client.SetToken(v.root)
	up := func(ctx context.Context) (bool, error) {
		h, err := v.client.Sys().HealthWithContext(ctx)
		return err == nil && h.Initialized && !h.Sealed, nil
	}
	if err := harness.WaitFor(ctx, "Vault to serve", 30*time.Second, up); err != nil {
		t.Fatalf("%v\n%s", err, v.log.String())
	}
	// The pinned Vault is its minimal build: its Kubernetes auth method is
	// the external plugin built beside it, registered under the built-in
	// method's name (hack/tools.sh vault).
	plugin, err := os.ReadFile(filepath.Join(dir, "plugins", kubeAuthPlugin))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.client.Sys().RegisterPluginWithContext(ctx, &vault.RegisterPluginInput{
		Name: "kubernetes", Type: vault.PluginTypeCredential, Command: kubeAuthPlugin, SHA256: sha(string(plugin)),
	}); err != nil {
		t.Fatalf("registering Vault's Kubernetes auth plugin: %v\n%s", err, v.log.String())
	}
	return v
}

// runnerToken gives the runners of namespace ns a Vault token of their own:
// Vault's policy "runner" set to policy, a token of it, and the Secret
// vault-token in ns holding it (the platform's secretName). It returns the
// token.
func (v *vaultServer) runnerToken(ctx context.Context, t testing.TB, cfg *envconf.Config, ns, policy string) string {
	t.Helper()
	if err := v.client.Sys().PutPolicyWithContext(ctx, "runner", policy); err != nil {
		t.Fatal(err)
	}
	tok, err := v.client.Auth().Token().CreateWithContext(ctx, &vault.TokenCreateRequest{Policies: []string{"runner"}, TTL: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Client().Resources(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "vault-token", Namespace: ns},
		StringData: map[string]string{"token": tok.Auth.ClientToken},
	}); err != nil {
		t.Fatal(err)
	}
	return tok.Auth.ClientToken
}

// kubeAuthPlugin is the file name of Vault's Kubernetes auth method in the
// pinned Vault's plugin folder.
const kubeAuthPlugin = "vault-plugin-auth-kubernetes"

// teamAPatterns lets the runner namespaces of these suites read what Vault
// namespace team-a holds (a namespace names no patterns by default, and may
// then read nothing).
const teamAPatterns = "secretRefs: {allowedPatterns: [\"vault:team-a:**\"]}\n"

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// TestSecretsResolvedInThePod runs tasks whose variables hold Vault
// references through the dispatcher and the webhook on the real node, with a
// real Vault: the runner sees the values (KV v2 and v1, a reference inside
// other text), the store's token never reaches it, and a reference the
// runner's Vault policy denies ends the task SecretResolutionFailed naming
// the variable and the reference. No value is found in any object, event or
// log of the namespace, nor in the dispatcher's and the webhook's logs.
func TestSecretsResolvedInThePod(t *testing.T) {
	t.Parallel()
	f := features.New("secrets resolved in the pod").
		Setup(secretsSetup).
		Assess("values reach the runner only, failures are named", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			v := startVault(ctx, t)
			values := map[string]string{"db": "s3cr3t-" + rand.Text(), "v1": "kv1-" + rand.Text(), "other": "other-" + rand.Text()}
			if _, err := v.client.KVv2("secret").Put(ctx, "db", map[string]any{"password": values["db"]}); err != nil {
				t.Fatal(err)
			}
			if _, err := v.client.KVv2("secret").Put(ctx, "other", map[string]any{"password": values["other"]}); err != nil {
				t.Fatal(err)
			}
			if err := v.client.Sys().MountWithContext(ctx, "kv1", &vault.MountInput{Type: "kv", Options: map[string]string{"version": "1"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := v.client.Logical().WriteWithContext(ctx, "kv1/app", map[string]any{"token": values["v1"]}); err != nil {
				t.Fatal(err)
			}
			runnerToken := v.runnerToken(ctx, t, cfg, ns, `
path "secret/data/db" { capabilities = ["read"] }
path "kv1/app" { capabilities = ["read"] }
`)
			r := cfg.Client().Resources(ns)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			w := startWebhookWith(ctx, t, cfg, fmt.Sprintf("secretStores:\n  vault: {enabled: true, address: %q, secretName: vault-token, kvMounts: [secret, kv1]}\n%s", v.addr, teamAPatterns))
			d := startDispatcher(ctx, t, cfg, ns)

			resolved := runnerTask(ns, "resolved", `printf %s "$TF_VAR_db_password" | sha256sum; printf %s "$TF_VAR_dsn" | sha256sum; printf %s "$TF_VAR_v1" | sha256sum; echo "vault token: ${VAULT_TOKEN:-none}"`)
			resolved.Spec.Env = []corev1.EnvVar{
				{Name: "TF_VAR_db_password", Value: "${vault:secret/db.password@team-a}"},
				{Name: "TF_VAR_dsn", Value: "postgres://app:${vault:secret/db.password@team-a}@db:5432/app"},
				{Name: "TF_VAR_v1", Value: "${vault:kv1/app.token@team-a}"},
			}
			denied := runnerTask(ns, "denied", "true")
			denied.Spec.Env = []corev1.EnvVar{{Name: "TF_VAR_other", Value: "${vault:secret/other.password@team-a}"}}
			for _, rt := range []*v1alpha1.RunnerTask{resolved, denied} {
				if err := r.Create(ctx, rt); err != nil {
					t.Fatal(err)
				}
			}
			logs := ""
			got := waitPhase(ctx, t, cfg, resolved, d)
			if got.Status.Phase != v1alpha1.PhaseSucceeded {
				t.Errorf("task resolved: %s %s: %s\nwebhook log:\n%s", got.Status.Phase, got.Status.Reason, got.Status.Message, tail(w.log.String(), 3000))
			} else {
				out, err := suite.Kubectl(ctx, cfg, "logs", "-n", ns, "job/"+got.Status.JobName, "-c", "main")
				if err != nil {
					t.Fatal(err)
				}
				logs += out
				for _, want := range []string{sha(values["db"]), sha("postgres://app:" + values["db"] + "@db:5432/app"), sha(values["v1"]), "vault token: none"} {
					if !strings.Contains(out, want) {
						t.Errorf("the runner's log %q lacks %q", out, want)
					}
				}
			}
			got = waitPhase(ctx, t, cfg, denied, d)
			want := "container main env TF_VAR_other: ${vault:secret/other.password@team-a}: vault: reading secret/data/other"
			if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "SecretResolutionFailed" || !strings.Contains(got.Status.Message, want) || !strings.Contains(got.Status.Message, "permission denied") {
				t.Errorf("task denied: %s %s: %q, want Failed, SecretResolutionFailed, naming %q", got.Status.Phase, got.Status.Reason, got.Status.Message, want)
			} else {
				t.Logf("the denied task's status: %s: %s", got.Status.Reason, got.Status.Message)
			}

			// The dispatcher's preflight found the API server keeps
			// fileKeyRef (EnvFiles, on by default since 1.35).
			if log := d.log.String(); !strings.Contains(log, "preflight passed") || strings.Contains(log, "env files") {
				t.Errorf("the dispatcher's preflight did not pass, or found no env files:\n%s", tail(log, 3000))
			}

			// No value anywhere the cluster keeps or shows.
			dump, err := suite.Kubectl(ctx, cfg, "get", "pods,jobs,runnertasks,events,configmaps", "-n", ns, "-o", "yaml")
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []string{"runwarden-secrets", "main"} {
				for _, j := range []string{"resolved", "denied"} {
					out, _ := suite.Kubectl(ctx, cfg, "logs", "-n", ns, "job/"+jobName(ctx, t, cfg, ns, j), "-c", c)
					logs += out
				}
			}
			for what, text := range map[string]string{"objects and events": dump, "pod logs": logs, "dispatcher log": d.log.String(), "webhook log": w.log.String()} {
				for name, value := range values {
					if strings.Contains(text, value) {
						t.Errorf("the %s value is in the %s", name, what)
					}
				}
				if strings.Contains(text, runnerToken) {
					t.Errorf("the runner's Vault token is in the %s", what)
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// secretsSetup is the setup of the secrets features: the real node with
// runwarden's images, and the RunnerTask CRD.
func secretsSetup(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
	harness.RequireRealNode(ctx, t, cfg)
	if err := suite.LoadImages(ctx, "runner", "webhook"); err != nil {
		t.Fatal(err)
	}
	installCRD(ctx, t, cfg)
	return ctx
}

// runnerLog submits rt, requires it to succeed and returns its runner
// container's log.
func runnerLog(ctx context.Context, t *testing.T, cfg *envconf.Config, rt *v1alpha1.RunnerTask, d *dispatcherProcess) string {
	t.Helper()
	if err := cfg.Client().Resources(rt.Namespace).Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	got := waitPhase(ctx, t, cfg, rt, d)
	if got.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("task %s: %s %s: %s", rt.Name, got.Status.Phase, got.Status.Reason, got.Status.Message)
	}
	out, err := suite.Kubectl(ctx, cfg, "logs", "-n", rt.Namespace, "job/"+got.Status.JobName, "-c", "main")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// jobName is the name of the Job of a RunnerTask.
func jobName(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, task string) string {
	t.Helper()
	got := &v1alpha1.RunnerTask{}
	if err := cfg.Client().Resources(ns).Get(ctx, task, ns, got); err != nil {
		t.Fatal(err)
	}
	return got.Status.JobName
}

// TestSecretsDeliveredAsFiles: with the platform's secretDelivery: files
// (for clusters without EnvFiles) a resolved value reaches the runner as a
// file named by NAME_FILE, on the in-memory volume, whatever it holds (a
// single quote, which an env file cannot); NAME is not set.
func TestSecretsDeliveredAsFiles(t *testing.T) {
	t.Parallel()
	f := features.New("secrets delivered as files").
		Setup(secretsSetup).
		Assess("the value is in the file NAME_FILE names", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			v := startVault(ctx, t)
			value := "it's " + rand.Text()
			if _, err := v.client.KVv2("secret").Put(ctx, "db", map[string]any{"password": value}); err != nil {
				t.Fatal(err)
			}
			r := cfg.Client().Resources(ns)
			if err := r.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "vault-token", Namespace: ns}, StringData: map[string]string{"token": v.root}}); err != nil {
				t.Fatal(err)
			}
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			startWebhookWith(ctx, t, cfg, fmt.Sprintf("secretDelivery: files\nsecretStores:\n  vault: {enabled: true, address: %q, secretName: vault-token}\n%s", v.addr, teamAPatterns))
			d := startDispatcher(ctx, t, cfg, ns)
			rt := runnerTask(ns, "as-file", `sha256sum < "$TF_VAR_db_password_FILE"; echo "TF_VAR_db_password set: ${TF_VAR_db_password+yes}"`)
			rt.Spec.Env = []corev1.EnvVar{{Name: "TF_VAR_db_password", Value: "${vault:secret/db.password@team-a}"}}
			out := runnerLog(ctx, t, cfg, rt, d)
			if !strings.Contains(out, sha(value)) || !strings.Contains(out, "TF_VAR_db_password set: \n") {
				t.Errorf("the runner's log %q: want the value's SHA-256 from the file, and TF_VAR_db_password unset", out)
			}
			if strings.Contains(out, value) {
				t.Error("the value is in the runner's log")
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecretsVaultKubernetesAuth: with the platform's Vault auth:
// kubernetes, the resolver logs in to the real Vault with the pod's projected
// service account token (audience vault), which Vault checks with the API
// server's TokenReview, and reads the secret the role's policy allows.
func TestSecretsVaultKubernetesAuth(t *testing.T) {
	t.Parallel()
	f := features.New("vault kubernetes auth").
		Setup(secretsSetup).
		Assess("the resolver logs in as the pod's service account", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			v := startVault(ctx, t)
			value := "k8s-auth-" + rand.Text()
			if _, err := v.client.KVv2("secret").Put(ctx, "db", map[string]any{"password": value}); err != nil {
				t.Fatal(err)
			}
			if err := v.client.Sys().PutPolicyWithContext(ctx, "runner", `path "secret/data/db" { capabilities = ["read"] }`); err != nil {
				t.Fatal(err)
			}
			// Vault reviews the pods' tokens with a reviewer of its own.
			r := cfg.Client().Resources(ns)
			reviewer := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "vault-reviewer", Namespace: ns}}
			if err := r.Create(ctx, reviewer); err != nil {
				t.Fatal(err)
			}
			crb := &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "vault-reviewer-" + ns},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
				Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: reviewer.Name, Namespace: ns}},
			}
			if err := cfg.Client().Resources().Create(ctx, crb); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), crb) })
			cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
			if err != nil {
				t.Fatal(err)
			}
			tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, reviewer.Name, &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rc := cfg.Client().RESTConfig()
			ca := string(rc.CAData)
			if ca == "" && rc.CAFile != "" {
				b, err := os.ReadFile(rc.CAFile)
				if err != nil {
					t.Fatal(err)
				}
				ca = string(b)
			}
			if err := v.client.Sys().EnableAuthWithOptionsWithContext(ctx, "kubernetes", &vault.EnableAuthOptions{Type: "kubernetes"}); err != nil {
				t.Fatal(err)
			}
			if _, err := v.client.Logical().WriteWithContext(ctx, "auth/kubernetes/config", map[string]any{
				"kubernetes_host": rc.Host, "kubernetes_ca_cert": ca, "token_reviewer_jwt": tr.Status.Token, "disable_local_ca_jwt": true,
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := v.client.Logical().WriteWithContext(ctx, "auth/kubernetes/role/runner", map[string]any{
				"bound_service_account_names": "default", "bound_service_account_namespaces": ns,
				"audience": "vault", "token_policies": "runner", "token_ttl": "10m",
			}); err != nil {
				t.Fatal(err)
			}
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			startWebhookWith(ctx, t, cfg, fmt.Sprintf("secretStores:\n  vault: {enabled: true, address: %q, auth: kubernetes, role: runner}\n%s", v.addr, teamAPatterns))
			d := startDispatcher(ctx, t, cfg, ns)
			rt := runnerTask(ns, "k8s-auth", `printf %s "$TF_VAR_db_password" | sha256sum`)
			rt.Spec.Env = []corev1.EnvVar{{Name: "TF_VAR_db_password", Value: "${vault:secret/db.password@team-a}"}}
			out := runnerLog(ctx, t, cfg, rt, d)
			if !strings.Contains(out, sha(value)) {
				t.Errorf("the runner's log %q lacks the value's SHA-256", out)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityVaultReferences: a task author's reference reads only a
// key-value secret of a mount the platform names, in a Vault namespace its
// namespace's patterns name, on a real Vault: Vault's own paths (the
// resolver's token by auth/token/lookup-self, an identity token, the
// cubbyhole, sys/), a mount the platform does not name and another Vault
// namespace are refused at admission, naming the rule; a mount of another
// engine the platform named as key-value is refused by the resolver, which
// asks Vault what the mount is and never reads it. Vault's audit log shows
// that none of them was ever read, while KV v2 and v1 still resolve.
func TestSecurityVaultReferences(t *testing.T) {
	t.Parallel()
	f := features.New("vault references").
		Setup(secretsSetup).
		Assess("only named key-value mounts are read", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			v := startVault(ctx, t)
			value, v1 := "s3cr3t-"+rand.Text(), "kv1-"+rand.Text()
			if _, err := v.client.KVv2("secret").Put(ctx, "db", map[string]any{"password": value}); err != nil {
				t.Fatal(err)
			}
			for path, in := range map[string]*vault.MountInput{"kv1": {Type: "kv", Options: map[string]string{"version": "1"}}, "transit": {Type: "transit"}} {
				if err := v.client.Sys().MountWithContext(ctx, path, in); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := v.client.Logical().WriteWithContext(ctx, "kv1/app", map[string]any{"token": v1}); err != nil {
				t.Fatal(err)
			}
			if _, err := v.client.Logical().WriteWithContext(ctx, "transit/keys/k", nil); err != nil {
				t.Fatal(err)
			}
			// The runner's token may read every path below (Vault's default
			// policy adds its own token's lookup and its cubbyhole): only
			// runwarden stands between a task and them.
			if err := v.client.Sys().PutPolicyWithContext(ctx, "runner", `
path "secret/data/*" { capabilities = ["read"] }
path "kv1/*" { capabilities = ["read"] }
path "transit/keys/*" { capabilities = ["read"] }
path "sys/mounts" { capabilities = ["read"] }
`); err != nil {
				t.Fatal(err)
			}
			tok, err := v.client.Auth().Token().CreateWithContext(ctx, &vault.TokenCreateRequest{Policies: []string{"runner"}, TTL: "1h"})
			if err != nil {
				t.Fatal(err)
			}
			// Vault's audit log from here on holds what the resolvers ask,
			// not the setup above.
			audit := filepath.Join(t.TempDir(), "audit.log")
			if err := v.client.Sys().EnableAuditWithOptionsWithContext(ctx, "file", &vault.EnableAuditOptions{Type: "file", Options: map[string]string{"file_path": audit}}); err != nil {
				t.Fatal(err)
			}
			r := cfg.Client().Resources(ns)
			if err := r.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "vault-token", Namespace: ns},
				StringData: map[string]string{"token": tok.Auth.ClientToken},
			}); err != nil {
				t.Fatal(err)
			}
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			// transit is named as a key-value mount by mistake: the resolver
			// checks the mount's type before it reads.
			w := startWebhookWith(ctx, t, cfg, fmt.Sprintf("secretStores:\n  vault: {enabled: true, address: %q, secretName: vault-token, kvMounts: [secret, kv1, transit]}\n%s", v.addr, teamAPatterns))
			d := startDispatcher(ctx, t, cfg, ns)
			author, err := taskAuthor(ctx, t, cfg, ns).Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tests := []struct {
				name, ref, reason, want string
			}{
				{"own-token", "${vault:auth/token/lookup-self.id@team-a}", job.ReasonAdmission, "env TF_VAR_x: ${vault:auth/token/lookup-self.id@team-a} reads Vault's own auth/ path, not a stored secret"},
				{"identity-token", "${vault:identity/oidc/token/runner.token@team-a}", job.ReasonAdmission, "reads Vault's own identity/ path, not a stored secret"},
				{"cubbyhole", "${vault:cubbyhole/x.y@team-a}", job.ReasonAdmission, "reads Vault's own cubbyhole/ path, not a stored secret"},
				{"sys", "${vault:sys/mounts.secret@team-a}", job.ReasonAdmission, "reads Vault's own sys/ path, not a stored secret"},
				{"unnamed-mount", "${vault:other/x.y@team-a}", job.ReasonAdmission, "is under no Vault mount the platform names (kv1/, secret/, transit/"},
				{"other-namespace", "${vault:secret/db.password@team-b}", job.ReasonAdmission, "env TF_VAR_x: namespace " + ns + " may not read ${vault:secret/db.password@team-b} (vault:team-b:secret/db; allowed: vault:team-a:**)"},
				{"engine-named-as-kv", "${vault:transit/keys/k.name@team-a}", "SecretResolutionFailed", "vault: mount transit/ is a \"transit\" mount, not key-value"},
			}
			for _, tc := range tests {
				rt := runnerTask(ns, tc.name, "true")
				rt.Spec.Env = []corev1.EnvVar{{Name: "TF_VAR_x", Value: tc.ref}}
				if err := author.Create(ctx, rt); err != nil {
					t.Fatal(err)
				}
			}
			for _, tc := range tests {
				got := waitPhase(ctx, t, cfg, runnerTask(ns, tc.name, ""), d)
				if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != tc.reason || !strings.Contains(got.Status.Message, tc.want) {
					t.Errorf("task %s: %s %s: %q; want Failed, %s, naming %q", tc.name, got.Status.Phase, got.Status.Reason, got.Status.Message, tc.reason, tc.want)
				}
			}
			ok := runnerTask(ns, "kv", `printf %s "$TF_VAR_db" | sha256sum; printf %s "$TF_VAR_v1" | sha256sum`)
			ok.Spec.Env = []corev1.EnvVar{{Name: "TF_VAR_db", Value: "${vault:secret/db.password@team-a}"}, {Name: "TF_VAR_v1", Value: "${vault:kv1/app.token@team-a}"}}
			if out := runnerLog(ctx, t, cfg, ok, d); !strings.Contains(out, sha(value)) || !strings.Contains(out, sha(v1)) {
				t.Errorf("KV v2 and v1 values did not reach the runner: %q\nwebhook log:\n%s", out, tail(w.log.String(), 3000))
			}

			// What Vault was asked, from its audit log: the KV reads, the
			// mount lookup of transit/, and nothing else a task named.
			b, err := os.ReadFile(audit)
			if err != nil {
				t.Fatal(err)
			}
			paths := map[string]bool{}
			for line := range strings.Lines(string(b)) {
				var e struct {
					Request struct {
						Path string `json:"path"`
					} `json:"request"`
				}
				if json.Unmarshal([]byte(line), &e) == nil && e.Request.Path != "" {
					paths[e.Request.Path] = true
				}
			}
			for _, want := range []string{"secret/data/db", "kv1/app", "sys/internal/ui/mounts/transit/keys/k"} {
				if !paths[want] {
					t.Errorf("Vault's audit log has no request for %s: %v", want, slices.Sorted(maps.Keys(paths)))
				}
			}
			for p := range paths {
				for _, never := range []string{"auth/token/lookup-self", "identity/", "cubbyhole/", "sys/mounts", "other/", "transit/keys/k"} {
					if strings.HasPrefix(p, never) {
						t.Errorf("Vault was asked for %s, which a task named", p)
					}
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

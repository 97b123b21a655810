//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// giteaVaultWorkflows are the jobs of TestGiteaSourceThroughTheWebhook, one
// commit: RUNNER_IMAGE is the runner image's reference.
var giteaVaultWorkflows = map[string]string{
	// OpenTofu applies with a Vault value (resolved in the pod) and a Gitea
	// secret (in the job's plan): the log shows a hash of both, never either;
	// printed, both are masked.
	".gitea/workflows/apply.yml": `on:
  push:
    paths: ['vault.txt']
jobs:
  apply:
    runs-on: tofu
    container:
      image: RUNNER_IMAGE
      env:
        TF_VAR_db_password: ${vault:secret/db.password@team-a}
    env:
      TF_VAR_deploy_key: ${{ secrets.DEPLOY_KEY }}
    steps:
      - name: apply
        run: |
          cat > main.tf <<'EOF'
          variable "db_password" { sensitive = true }
          variable "deploy_key" { sensitive = true }
          output "h" { value = nonsensitive(sha256("${var.db_password}/${var.deploy_key}")) }
          EOF
          tofu init -input=false >/dev/null
          tofu apply -auto-approve -input=false >/dev/null
          echo "applied $(tofu output -raw h)"
          echo "vault token: ${VAULT_TOKEN:-none}"
          echo "printed by mistake: $TF_VAR_db_password and $TF_VAR_deploy_key"
`,
	// A reference the runner's Vault policy does not let it read: the pod
	// fails to resolve it, the job fails saying so.
	".gitea/workflows/denied.yml": `on:
  push:
    paths: ['vault.txt']
jobs:
  denied:
    runs-on: tofu
    container:
      image: RUNNER_IMAGE
      env:
        TF_VAR_other: ${vault:secret/other.password@team-a}
    steps:
      - run: echo never
`,
	// A reference the namespace's platform configuration does not allow:
	// the webhook's policy refuses the pod, the job fails with its message.
	".gitea/workflows/refused.yml": `on:
  push:
    paths: ['vault.txt']
jobs:
  refused:
    runs-on: tofu
    container:
      image: RUNNER_IMAGE
      env:
        TF_VAR_db_password: ${vault:secret/db.password@team-b}
    steps:
      - run: echo never
`,
	"vault.txt": "the jobs\n",
}

// TestGiteaSourceThroughTheWebhook runs Gitea jobs whose container.env
// holds Vault references through the dispatcher and the webhook on the
// real node, with a real Vault and a real Gitea: OpenTofu applies with the
// resolved value and a Gitea secret; a reference Vault denies fails its
// job with SecretResolutionFailed naming it; one the platform's policy does
// not allow is refused at admission, the job failed with the policy's
// message. No value is in Gitea's logs, the dispatcher's or the webhook's.
func TestGiteaSourceThroughTheWebhook(t *testing.T) {
	t.Parallel()
	f := features.New("gitea source through the webhook").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			if err := suite.LoadImages(ctx, "runner", "dispatcher", "webhook"); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("a Vault reference resolved, one denied, one refused by policy", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			parent := ctx
			ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
			defer cancel()
			v := startVault(ctx, t)
			values := map[string]string{"db": "s3cr3t-" + rand.Text(), "other": "other-" + rand.Text(), "key": "key-" + rand.Text()}
			for path, value := range map[string]string{"db": values["db"], "other": values["other"]} {
				if _, err := v.client.KVv2("secret").Put(ctx, path, map[string]any{"password": value}); err != nil {
					t.Fatal(err)
				}
			}
			runnerToken := v.runnerToken(ctx, t, cfg, ns, `path "secret/data/db" { capabilities = ["read"] }`)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			w := startWebhookWith(ctx, t, cfg, fmt.Sprintf("secretStores:\n  vault: {enabled: true, address: %q, secretName: vault-token, kvMounts: [secret]}\n%s", v.addr, teamAPatterns))

			g := harness.StartGitea(ctx, t, suite.RepoRoot, realNodeGateway)
			if err := g.CreateRepo(ctx, "infra"); err != nil {
				t.Fatal(err)
			}
			if err := g.SetSecret(ctx, "infra", "DEPLOY_KEY", values["key"]); err != nil {
				t.Fatal(err)
			}
			d := startGiteaDispatcher(ctx, t, cfg, ns, g)
			runnerImage, err := suite.ImageRef(ctx, "runner")
			if err != nil {
				t.Fatal(err)
			}
			files := map[string]string{}
			for p, f := range giteaVaultWorkflows {
				files[p] = strings.ReplaceAll(f, "RUNNER_IMAGE", runnerImage)
			}
			if err := g.PutFiles(ctx, "infra", files); err != nil {
				t.Fatal(err)
			}
			jobs := waitGiteaJobs(ctx, t, g, "infra", d, map[string]string{"apply": "completed", "denied": "completed", "refused": "completed"})
			logs := map[string]string{}
			for name, j := range jobs {
				log, err := g.Log(ctx, "infra", j.ID)
				if err != nil {
					t.Fatal(err)
				}
				logs[name] = log
			}
			for name, c := range map[string]struct {
				conclusion string
				want       []string
			}{
				"apply":   {"success", []string{"applied " + sha(values["db"]+"/"+values["key"]), "vault token: none", "printed by mistake: *** and ***"}},
				"denied":  {"failure", []string{"runwarden: SecretResolutionFailed", "TF_VAR_other: ${vault:secret/other.password@team-a}", "permission denied"}},
				"refused": {"failure", []string{"runwarden: AdmissionRejected", "secret-ref-name", "may not read"}},
			} {
				if jobs[name].Conclusion != c.conclusion {
					t.Errorf("%s: %s, want %s; its log:\n%s", name, jobs[name].Conclusion, c.conclusion, logs[name])
					continue
				}
				for _, want := range c.want {
					if !strings.Contains(logs[name], want) {
						t.Errorf("%s's log at Gitea lacks %q:\n%s", name, want, logs[name])
					}
				}
			}
			t.Logf("the refused job's log at Gitea ends:\n%s", tail(logs["refused"], 600))
			all := strings.Join([]string{logs["apply"], logs["denied"], logs["refused"]}, "\n")
			for what, text := range map[string]string{"Gitea's logs": all, "dispatcher log": d.log.String(), "webhook log": w.log.String()} {
				for name, value := range values {
					if strings.Contains(text, value) {
						t.Errorf("the %s value is in the %s", name, what)
					}
				}
				if strings.Contains(text, runnerToken) {
					t.Errorf("the runner's Vault token is in the %s", what)
				}
			}
			return parent
		}).Feature()
	testenv.Test(t, f)
}

// TestGiteaPreflightProvesTheStepsPod starts the Gitea source where the
// webhook's policy allows runner images from localhost only and the steps
// image (the init container the source adds) is from elsewhere: the
// preflight's pod is shaped as the source shapes its jobs', so the
// dispatcher exits naming the refusal rather than failing every job later.
func TestGiteaPreflightProvesTheStepsPod(t *testing.T) {
	t.Parallel()
	f := features.New("gitea preflight").
		Assess("a steps image the policy refuses fails the preflight", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			startWebhookWith(ctx, t, cfg, "shape:\n  allowedRegistries: [localhost]\n")
			ctl := controlNamespace(ctx, t, cfg, ns)
			d := startDispatcherProcess(ctx, t, cfg, ns, "--preflight-timeout=2m",
				"--source=gitea", "--gitea-url=http://127.0.0.1:1", "--gitea-labels=tofu",
				"--gitea-identity-secret="+ctl+"/gitea-runner", "--gitea-steps-image=evil.example.net/steps:1")
			if err := d.cmd.Run(); err == nil {
				t.Fatalf("the dispatcher started though its steps image is refused:\n%s", d.log.String())
			}
			for _, w := range []string{"preflight failed", "not admitted", "allowed-registries", "evil.example.net/steps:1"} {
				if !strings.Contains(d.log.String(), w) {
					t.Errorf("the dispatcher's error does not say %q:\n%s", w, d.log.String())
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

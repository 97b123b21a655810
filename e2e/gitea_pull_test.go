//go:build e2e

package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// giteaPullWorkflow is a workflow run for pull requests, its jobs named
// with prefix: one whose container.env holds a secret reference, one
// without.
func giteaPullWorkflow(prefix string) string {
	return strings.NewReplacer("PREFIX", prefix).Replace(`on: pull_request
jobs:
  PREFIX-refs:
    runs-on: sim
    container:
      image: busybox:stable
      env:
        DB: ${vault:secret/db.password@team-a}
    steps:
      - run: echo with a reference
  PREFIX-plain:
    runs-on: sim
    steps:
      - run: echo without one
`)
}

// TestGiteaSourcePullRequests runs the jobs of pull requests on a real
// Gitea, from a branch of the repository and from forks. Gitea gives a
// fork's jobs no secrets; by default runwarden does not run them at all
// (their code would run with the platform's identity and template): they
// fail with the reason and no Job, while the repository's own run, its
// job with a container.env secret reference among them. With
// --gitea-fork-pull-requests=run a fork's job runs without secret
// references: its job with one fails with the reason, no Job made.
func TestGiteaSourcePullRequests(t *testing.T) {
	t.Parallel()
	f := features.New("gitea pull requests").
		Assess("a fork's job is refused, or run without secret references; the repository's own run", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			parent := ctx
			ctx, cancel := context.WithTimeout(ctx, 9*time.Minute)
			defer cancel()
			g := harness.StartGitea(ctx, t, suite.RepoRoot, "127.0.0.1")
			const wf = ".gitea/workflows/pr.yml"
			must := func(steps ...func() error) {
				t.Helper()
				for _, step := range steps {
					if err := step(); err != nil {
						t.Fatal(err)
					}
				}
			}
			must(func() error { return g.CreateRepo(ctx, "infra") },
				func() error { return g.CreateOrg(ctx, "outside") },
				func() error { return g.Fork(ctx, "infra", "outside") })
			ctl := controlNamespace(ctx, t, cfg, ns)
			token := g.RegistrationTokenFile(t)
			d := startDispatcher(ctx, t, cfg, ns, "--simulated", "--preflight=false", "--env-allow=DB", "--succeeded-history=20", "--failed-history=20",
				"--source=gitea", "--gitea-url="+g.URL, "--gitea-labels=sim", "--gitea-identity-secret="+ctl+"/gitea-runner",
				"--gitea-steps-image=busybox:stable", "--gitea-registration-token-file="+token,
				"--gitea-fetch-interval=200ms", "--gitea-report-interval=500ms")
			const (
				notRun     = "a job of a pull request from a fork or by AGit flow is not run by this runner"
				noSecretIn = "a secret reference in a job of a pull request from a fork or by AGit flow is refused"
			)
			// check waits for the jobs of want (name to conclusion) and
			// checks which of them say why they were refused.
			check := func(want map[string]string, refusedWith map[string]string) {
				t.Helper()
				status := map[string]string{}
				for name := range want {
					status[name] = "completed"
				}
				jobs := waitGiteaJobs(ctx, t, g, "infra", d, status)
				for name, conclusion := range want {
					log, err := g.Log(ctx, "infra", jobs[name].ID)
					if err != nil {
						t.Fatal(err)
					}
					if jobs[name].Conclusion != conclusion {
						t.Errorf("%s: %s, want %s; its log:\n%s", name, jobs[name].Conclusion, conclusion, log)
					}
					why, refused := refusedWith[name]
					if refused && !strings.Contains(log, why) || !refused && (strings.Contains(log, notRun) || strings.Contains(log, noSecretIn)) {
						t.Errorf("%s: want refused %v (%q); its log:\n%s", name, refused, why, log)
					}
				}
			}
			must(func() error {
				return g.PutFilesOn(ctx, g.Admin, "infra", "inside", map[string]string{wf: giteaPullWorkflow("same")})
			},
				func() error { return g.OpenPull(ctx, "infra", "inside") },
				func() error {
					return g.PutFilesOn(ctx, "outside", "infra", "change", map[string]string{wf: giteaPullWorkflow("fork")})
				},
				func() error { return g.OpenPull(ctx, "infra", "outside:change") })
			check(map[string]string{"same-refs": "success", "same-plain": "success", "fork-refs": "failure", "fork-plain": "failure"},
				map[string]string{"fork-refs": notRun, "fork-plain": notRun})

			// The platform runs forks' jobs: without secret references.
			d.stop(os.Interrupt)
			d.args = append(d.args, "--gitea-fork-pull-requests=run")
			d.start(ctx, t)
			must(func() error {
				return g.PutFilesOn(ctx, "outside", "infra", "change2", map[string]string{wf: giteaPullWorkflow("fork2")})
			},
				func() error { return g.OpenPull(ctx, "infra", "outside:change2") })
			check(map[string]string{"same-refs": "success", "same-plain": "success", "fork-refs": "failure", "fork-plain": "failure",
				"fork2-refs": "failure", "fork2-plain": "success"},
				map[string]string{"fork-refs": notRun, "fork-plain": notRun, "fork2-refs": noSecretIn})
			// A Job for each job run: the repository's two, the second
			// fork's job without a reference.
			var list batchv1.JobList
			if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != 3 {
				t.Errorf("%d Jobs, want 3", len(list.Items))
			}
			return parent
		}).Feature()
	testenv.Test(t, f)
}

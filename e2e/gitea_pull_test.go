//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
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

// TestGiteaSourcePullRequests runs the jobs of two pull requests on a real
// Gitea: one from a branch of the repository, one from a fork. Gitea gives
// the fork's jobs no secrets; runwarden resolves no secret reference for
// them either: the fork's job with a container.env reference fails with
// the reason and no Job, its job without one runs; the same repository's
// job with the reference runs.
func TestGiteaSourcePullRequests(t *testing.T) {
	t.Parallel()
	f := features.New("gitea pull requests").
		Assess("a fork's job gets no secret reference, the repository's own does", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			parent := ctx
			ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			g := harness.StartGitea(ctx, t, suite.RepoRoot, "127.0.0.1")
			for _, step := range []func() error{
				func() error { return g.CreateRepo(ctx, "infra") },
				func() error { return g.CreateOrg(ctx, "outside") },
				func() error { return g.Fork(ctx, "infra", "outside") },
			} {
				if err := step(); err != nil {
					t.Fatal(err)
				}
			}
			ctl := controlNamespace(ctx, t, cfg, ns)
			token := filepath.Join(t.TempDir(), "registration-token")
			if err := os.WriteFile(token, []byte(g.RegistrationToken), 0o600); err != nil {
				t.Fatal(err)
			}
			d := startDispatcher(ctx, t, cfg, ns, "--simulated", "--preflight=false", "--env-allow=DB", "--succeeded-history=20", "--failed-history=20",
				"--source=gitea", "--gitea-url="+g.URL, "--gitea-labels=sim", "--gitea-identity-secret="+ctl+"/gitea-runner",
				"--gitea-steps-image=busybox:stable", "--gitea-registration-token-file="+token,
				"--gitea-fetch-interval=200ms", "--gitea-report-interval=500ms")
			const wf = ".gitea/workflows/pr.yml"
			for _, step := range []func() error{
				func() error {
					return g.PutFilesOn(ctx, g.Admin, "infra", "inside", map[string]string{wf: giteaPullWorkflow("same")})
				},
				func() error { return g.OpenPull(ctx, "infra", "inside") },
				func() error {
					return g.PutFilesOn(ctx, "outside", "infra", "change", map[string]string{wf: giteaPullWorkflow("fork")})
				},
				func() error { return g.OpenPull(ctx, "infra", "outside:change") },
			} {
				if err := step(); err != nil {
					t.Fatal(err)
				}
			}
			jobs := waitGiteaJobs(ctx, t, g, "infra", d, map[string]string{
				"same-refs": "completed", "same-plain": "completed", "fork-refs": "completed", "fork-plain": "completed",
			})
			const refused = "a secret reference in a job of a pull request from a fork or by AGit flow is refused"
			for name, want := range map[string]string{"same-refs": "success", "same-plain": "success", "fork-refs": "failure", "fork-plain": "success"} {
				log, err := g.Log(ctx, "infra", jobs[name].ID)
				if err != nil {
					t.Fatal(err)
				}
				if jobs[name].Conclusion != want {
					t.Errorf("%s: %s, want %s; its log:\n%s", name, jobs[name].Conclusion, want, log)
				}
				if got := strings.Contains(log, refused); got != (name == "fork-refs") {
					t.Errorf("%s's log says the reference is refused: %v; its log:\n%s", name, got, log)
				}
			}
			// No Job for the refused one.
			var list batchv1.JobList
			if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != 3 {
				t.Errorf("%d Jobs, want 3 (every job but the refused one)", len(list.Items))
			}
			return parent
		}).Feature()
	testenv.Test(t, f)
}

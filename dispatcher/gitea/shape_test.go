package gitea

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/steps"
)

func TestJobOfAGiteaTask(t *testing.T) {
	tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "registry.example/runner:1"}}}}
	shaped, err := PodTemplate(tmpl, "registry.example/runwarden/dispatcher@sha256:abc")
	if err != nil {
		t.Fatal(err)
	}
	j, err := ReadJob([]byte("on: push\njobs:\n  apply:\n    runs-on: tofu\n    timeout-minutes: 2\n    container:\n      image: alpine:3\n      env:\n        TF_VAR_pw: ${vault:secret/db.password}\n    steps:\n      - run: echo ${{ secrets.TOKEN }}\n"))
	if err != nil {
		t.Fatal(err)
	}
	plan := j.Plan
	plan.Secrets = map[string]string{"TOKEN": "very-secret-token"}
	plan.Marker = "::m::"
	plan.Context = map[string]any{"server_url": "https://gitea.example/", "repository": "org/infra", "event_name": "push"}
	task, err := Task(42, "runners", j, plan)
	if err != nil {
		t.Fatal(err)
	}
	opts := job.Options{DispatcherID: "d", Template: shaped, EnvAllowList: []string{"TF_VAR_*"}}
	built, secret, err := job.Build(task, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(built)
	if strings.Contains(string(b), "very-secret-token") {
		t.Error("the job's secret is in the Job")
	}
	if secret == nil || !strings.Contains(string(secret.Data[PlanEnv])+secret.StringData[PlanEnv], "very-secret-token") {
		t.Fatal("the plan is not in the task's Secret")
	}
	var stored steps.Plan
	if err := json.Unmarshal([]byte(string(secret.Data[PlanEnv])+secret.StringData[PlanEnv]), &stored); err != nil || strings.Join(stored.MaskEnv, ",") != "TF_VAR_pw" {
		t.Errorf("the plan's MaskEnv %q (%v), want the container.env variable holding a secret reference", stored.MaskEnv, err)
	}
	spec := built.Spec.Template.Spec
	if len(spec.InitContainers) == 0 || spec.InitContainers[0].Name != StepsContainer || spec.InitContainers[0].Args[1] != "--install" {
		t.Errorf("init containers %+v", spec.InitContainers)
	}
	var main corev1.Container
	for _, c := range spec.Containers {
		if c.Name == job.RunnerContainer {
			main = c
		}
	}
	if main.Image != "alpine:3" || main.Command[0] != "/runwarden/bin/runwarden-steps" || strings.Join(main.Args, " ") != "steps --plan-env "+PlanEnv || main.WorkingDir != Workspace {
		t.Errorf("runner container %q %q %q %q", main.Image, main.Command, main.Args, main.WorkingDir)
	}
	var planRef, pw bool
	for _, e := range main.Env {
		if e.Name == PlanEnv && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			planRef = true
		}
		if e.Name == "TF_VAR_pw" && e.Value == "${vault:secret/db.password}" {
			pw = true
		}
	}
	if !planRef || !pw {
		t.Errorf("env %+v: want the plan from the Secret and the container's env with its reference", main.Env)
	}
	if d := built.Spec.ActiveDeadlineSeconds; d == nil || *d != 120 {
		t.Errorf("deadline %v, want the job's timeout-minutes, 120 s", d)
	}
	if !strings.Contains(built.Name, "gitea-42") && built.Name != job.Name("gitea-42") {
		t.Errorf("Job name %q is not the task's", built.Name)
	}
	if got := built.Spec.Template.Annotations[job.AnnotationRepoURL]; got != "https://gitea.example/org/infra.git" {
		t.Errorf("the runner pod's %s is %q, want the job's repository as its checkout clones it", job.AnnotationRepoURL, got)
	}
	// The platform's --repo-allow holds for Gitea's jobs as for every
	// source's.
	opts.RepoAllowList = []*regexp.Regexp{regexp.MustCompile(`^https://gitea\.example/platform/`)}
	if _, _, err := job.Build(task, opts); !errors.Is(err, job.ErrRepoNotAllowed) {
		t.Errorf("a job of a repository --repo-allow does not name: %v, want %v", err, job.ErrRepoNotAllowed)
	}
	if _, err := PodTemplate(corev1.PodTemplateSpec{}, "img"); err == nil {
		t.Error("a template without the runner container was shaped")
	}
}

// TestSecretReferencesOfUntrustedPullRequests: a job Gitea gives no
// secrets (a pull request's from a fork, by AGit flow, or a comment's on a
// pull request) gets no secret reference resolved either: its
// container.env reference is refused before any Job. A push, a pull request
// from a branch of the same repository and pull_request_target keep theirs.
func TestSecretReferencesOfUntrustedPullRequests(t *testing.T) {
	pr := func(headRepo, baseRepo float64, label string) map[string]any {
		return map[string]any{"pull_request": map[string]any{
			"head": map[string]any{"repo_id": headRepo, "label": label},
			"base": map[string]any{"repo_id": baseRepo, "label": "main"},
		}}
	}
	for _, tc := range []struct {
		name    string
		event   string
		payload map[string]any
		refused bool
	}{
		{"a push", "push", map[string]any{"ref": "refs/heads/main"}, false},
		{"a pull request from a branch of the repository", "pull_request", pr(7, 7, "feature"), false},
		{"a pull request from a fork", "pull_request", pr(9, 7, "feature"), true},
		{"a pull request by AGit flow", "pull_request", pr(7, 7, ""), true},
		{"a pull request's review from a fork", "pull_request_review_approved", pr(9, 7, "feature"), true},
		{"a pull request without its head's repository", "pull_request", map[string]any{"pull_request": map[string]any{"base": map[string]any{"repo_id": 7.0}}}, true},
		{"pull_request_target from a fork", "pull_request_target", pr(9, 7, "feature"), false},
		{"a comment on a pull request", "issue_comment", map[string]any{"is_pull": true, "issue": map[string]any{"number": 3.0}}, true},
		{"a comment on an issue", "issue_comment", map[string]any{"is_pull": false, "issue": map[string]any{"number": 4.0}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := &Job{ContainerEnv: map[string]string{"PLAIN": "x", "DB": "postgres://app:${vault:secret/db.password@team-a}@db"}}
			plan := steps.Plan{Job: "apply", Context: map[string]any{"event_name": tc.event, "event": tc.payload}}
			_, err := Task(1, "runners", j, plan)
			var r *Refusal
			if got := errors.As(err, &r); got != tc.refused {
				t.Fatalf("refused %v (%v), want %v", got, err, tc.refused)
			}
			if tc.refused && (!strings.Contains(r.Reason, "jobs.apply.container.env.DB: a secret reference") || r.Step != -1) {
				t.Errorf("refusal %q", r.Reason)
			}
			// Without a reference, the same job runs.
			delete(j.ContainerEnv, "DB")
			if _, err := Task(1, "runners", j, plan); err != nil {
				t.Errorf("the job without a secret reference: %v", err)
			}
		})
	}
}

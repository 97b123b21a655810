//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/runwarden/runwarden/dispatcher/gitea"
	"github.com/runwarden/runwarden/e2e/harness"
)

// TestGiteaRunnerProtocol drives a real Gitea's runner API with the Gitea
// source's client, as the source will: register with the instance's
// registration token, declare the labels, fetch nothing, push a workflow,
// fetch its job (with tasks_version as Gitea's own runner keeps it), read
// the job's workflow into a plan, send its log rows and step states, and
// end it; Gitea's REST API then shows the job succeeded with the steps and
// the log sent. A second job, using an action runwarden does not run, is
// read as a refusal naming the step and the action.
func TestGiteaRunnerProtocol(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	g := harness.StartGitea(ctx, t, suite.RepoRoot, "127.0.0.1")
	c := gitea.NewClient(&http.Client{Timeout: 30 * time.Second}, g.URL)
	if _, _, err := c.FetchTask(ctx, 0); !gitea.IsUnregistered(err) {
		t.Fatalf("FetchTask before registering: %v, want an unregistered runner", err)
	}
	id, err := c.Register(ctx, "runwarden-e2e", g.RegistrationToken, []string{"tofu"})
	if err != nil {
		t.Fatal(err)
	}
	c.SetIdentity(id)
	if err := c.Declare(ctx, []string{"tofu"}); err != nil {
		t.Fatal(err)
	}
	task, version, err := c.FetchTask(ctx, 0)
	if err != nil || task != nil || version == 0 {
		t.Fatalf("FetchTask with nothing queued = %v, %d, %v; want no task and a tasks version", task, version, err)
	}
	if err := g.CreateRepo(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if err := g.SetSecret(ctx, "app", "DEPLOY_KEY", "s3cret-value"); err != nil {
		t.Fatal(err)
	}
	if err := g.PutFile(ctx, "app", ".gitea/workflows/ci.yml", `on: push
jobs:
  apply:
    runs-on: tofu
    steps:
      - uses: actions/checkout@v4
      - name: plan
        run: echo planning
      - name: unsupported
        uses: actions/setup-go@v5
`); err != nil {
		t.Fatal(err)
	}
	if err := g.PutFile(ctx, "app", ".gitea/workflows/deploy.yml", `on: push
jobs:
  deploy:
    runs-on: tofu
    env:
      KEY: ${{ secrets.DEPLOY_KEY }}
    steps:
      - id: first
        run: echo "out=ok" >> "$GITHUB_OUTPUT"
      - if: always()
        run: echo done
`); err != nil {
		t.Fatal(err)
	}
	// Gitea makes the runs as it handles the pushes; each fetch takes one
	// job, the version reset to 0 after each as Gitea's runner does.
	tasks := map[string]*runnerv1.Task{}
	fetch := func(ctx context.Context) (bool, error) {
		task, v, err := c.FetchTask(ctx, version)
		if err != nil {
			return false, err
		}
		version = v
		if task != nil {
			version = 0
			j, err := gitea.ReadJob(task.GetWorkflowPayload())
			name := ""
			if j != nil {
				name = j.Plan.Job
			} else if r := (*gitea.Refusal)(nil); errors.As(err, &r) && strings.Contains(r.Reason, "setup-go") {
				name = "apply"
			}
			tasks[name] = task
		}
		return len(tasks) == 2, nil
	}
	if err := harness.WaitFor(ctx, "Gitea to hand out both jobs", 2*time.Minute, fetch); err != nil {
		t.Fatalf("%v (got %d)", err, len(tasks))
	}
	// The refused job: step 3's action, by name.
	_, err = gitea.ReadJob(tasks["apply"].GetWorkflowPayload())
	var r *gitea.Refusal
	if !errors.As(err, &r) || r.Step != 2 || !strings.Contains(r.Reason, "uses: actions/setup-go@v5: actions are not supported") {
		t.Fatalf("the job with an action: %v, want a refusal of step 3", err)
	}
	// The job runwarden runs: its secrets and context are the task's.
	deploy := tasks["deploy"]
	if deploy.GetSecrets()["DEPLOY_KEY"] != "s3cret-value" || deploy.GetSecrets()["GITEA_TOKEN"] == "" {
		t.Errorf("the task's secrets lack DEPLOY_KEY or the job's token: %v", keys(deploy.GetSecrets()))
	}
	if repo := deploy.GetContext().GetFields()["repository"].GetStringValue(); repo != g.Admin+"/app" {
		t.Errorf("the task's github.repository is %q", repo)
	}
	j, err := gitea.ReadJob(deploy.GetWorkflowPayload())
	if err != nil || len(j.Plan.Steps) != 2 || j.Plan.Env["KEY"] != "${{ secrets.DEPLOY_KEY }}" {
		t.Fatalf("the deploy job read as %+v, %v", j, err)
	}
	// Its log and steps, as the source sends them: rows, then the states
	// with each step's rows, then the end with an output.
	now := time.Now()
	rows := []*runnerv1.LogRow{
		{Time: timestamppb.New(now), Content: "runwarden: setting up"},
		{Time: timestamppb.New(now), Content: "first step"},
		{Time: timestamppb.New(now), Content: "done"},
	}
	ack, err := c.UpdateLog(ctx, deploy.GetId(), 0, rows[:2], false)
	if err != nil || ack != 2 {
		t.Fatalf("UpdateLog = %d, %v; want 2 rows acknowledged", ack, err)
	}
	if ack, err := c.UpdateLog(ctx, deploy.GetId(), 0, nil, false); err != nil || ack != 2 {
		t.Fatalf("an empty UpdateLog = %d, %v; want the acknowledged count, 2", ack, err)
	}
	if ack, err = c.UpdateLog(ctx, deploy.GetId(), 1, rows[1:], true); err != nil || ack != 3 {
		t.Fatalf("UpdateLog from an acknowledged row = %d, %v; want 3 (the repeated row skipped)", ack, err)
	}
	ts := timestamppb.New(now)
	state := &runnerv1.TaskState{
		Id: deploy.GetId(), Result: runnerv1.Result_RESULT_SUCCESS, StartedAt: ts, StoppedAt: ts,
		Steps: []*runnerv1.StepState{
			{Id: 0, Result: runnerv1.Result_RESULT_SUCCESS, StartedAt: ts, StoppedAt: ts, LogIndex: 1, LogLength: 1},
			{Id: 1, Result: runnerv1.Result_RESULT_SUCCESS, StartedAt: ts, StoppedAt: ts, LogIndex: 2, LogLength: 1},
		},
	}
	resp, err := c.UpdateTask(ctx, state, map[string]string{"out": "ok"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetState().GetResult() != runnerv1.Result_RESULT_SUCCESS || strings.Join(resp.GetSentOutputs(), ",") != "out" {
		t.Errorf("UpdateTask answered %v, outputs %v; want the success and the output held", resp.GetState().GetResult(), resp.GetSentOutputs())
	}
	// What Gitea shows.
	jobs, err := g.Jobs(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	var shown *harness.GiteaJob
	for i := range jobs {
		if jobs[i].Name == "deploy" {
			shown = &jobs[i]
		}
	}
	if shown == nil || shown.Status != "completed" || shown.Conclusion != "success" {
		t.Fatalf("Gitea shows the deploy job as %+v", shown)
	}
	log, err := g.Log(ctx, "app", shown.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"runwarden: setting up", "first step", "done"} {
		if strings.Count(log, want) != 1 {
			t.Errorf("Gitea's log of the job holds %q %d times, want once:\n%s", want, strings.Count(log, want), log)
		}
	}
}

package gitea

import (
	"errors"
	"strings"
	"testing"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/runwarden/runwarden/internal/steps"
)

func TestPlanFor(t *testing.T) {
	ctx, err := structpb.NewStruct(map[string]any{"repository": "team/app", "event": map[string]any{"ref": "refs/heads/main"}})
	if err != nil {
		t.Fatal(err)
	}
	task := &runnerv1.Task{
		Id: 7, Context: ctx,
		Secrets: map[string]string{"GITEA_TOKEN": "tok"},
		Vars:    map[string]string{"STAGE": "prod"},
		Needs:   map[string]*runnerv1.TaskNeed{"build": {Result: runnerv1.Result_RESULT_FAILURE, Outputs: map[string]string{"v": "1"}}},
	}
	job := &Job{Plan: steps.Plan{Job: "deploy", If: "failure()", Steps: []steps.Step{{Name: "s", Run: "true"}}}}
	p := PlanFor(task, job)
	if p.Context["repository"] != "team/app" || p.Secrets["GITEA_TOKEN"] != "tok" || p.Vars["STAGE"] != "prod" {
		t.Errorf("plan %+v", p)
	}
	if n := p.Needs["build"]; n.Result != "failure" || n.Outputs["v"] != "1" {
		t.Errorf("needs %+v", p.Needs)
	}
	if !strings.HasPrefix(p.Marker, "::runwarden-") || p.Marker == PlanFor(task, job).Marker {
		t.Errorf("marker %q: want one of the task's own", p.Marker)
	}
	// The needs reach the job's if: as Gitea's runner evaluates it.
	if ok, err := steps.JobRuns(&p); err != nil || !ok {
		t.Errorf("JobRuns = %v, %v; want the failure() job to run after a failed need", ok, err)
	}
	// The job's if: runs in the dispatcher without the secrets context
	// (GitHub's jobs.<id>.if has none): it cannot read a secret, nor put
	// one in an error the dispatcher logs.
	// A job's if: nested past what the dispatcher parses is refused, not
	// evaluated.
	p.If = strings.Repeat("(", 100000) + "true" + strings.Repeat(")", 100000)
	if _, err := steps.JobRuns(&p); err == nil || !strings.Contains(err.Error(), "at most 8192") {
		t.Errorf("a job's if: of 200,004 bytes: %v, want refused", err)
	}
	p.Secrets["GITEA_TOKEN"] = "s3cr3t-v4lue"
	p.If = "secrets.GITEA_TOKEN == 's3cr3t-v4lue'"
	if ok, err := steps.JobRuns(&p); err != nil || ok {
		t.Errorf("JobRuns = %v, %v; want false: no secrets at the job's level", ok, err)
	}
}

func TestTemplate(t *testing.T) {
	labels := map[string]string{"tofu": "tofu", "ubuntu-latest": "default", "linux": "default"}
	for _, tc := range []struct {
		runsOn []string
		want   string
		err    string
	}{
		{[]string{"tofu"}, "tofu", ""},
		{[]string{"ubuntu-latest", "linux"}, "default", ""},
		{[]string{"tofu", "linux"}, "", "the labels name two runner templates, tofu and default"},
		{[]string{"windows"}, "", `runs-on "windows": no runner template serves it (this runner's labels: linux, tofu, ubuntu-latest)`},
		{nil, "", "no runs-on labels"},
	} {
		got, err := Template(tc.runsOn, labels)
		var r *Refusal
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("Template(%q) = %q, %v; want %q", tc.runsOn, got, err, tc.want)
		case tc.err != "" && (!errors.As(err, &r) || !strings.Contains(r.Reason, tc.err)):
			t.Errorf("Template(%q) error %v, want a refusal with %q", tc.runsOn, err, tc.err)
		}
	}
}

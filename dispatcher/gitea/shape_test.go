package gitea

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/dispatcher/job"
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
		t.Error("the plan is not in the task's Secret")
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
	if _, err := PodTemplate(corev1.PodTemplateSpec{}, "img"); err == nil {
		t.Error("a template without the runner container was shaped")
	}
}

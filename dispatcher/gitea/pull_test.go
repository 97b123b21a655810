package gitea

import (
	"slices"
	"strings"
	"testing"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/structpb"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// TestForkPullRequestJobsAreRefused: by default the job of a pull request
// from a fork is reported failed with the reason and no Job is made, as its
// code would run in a runner pod with the platform's identity; with
// RunForkPullRequests (--gitea-fork-pull-requests=run) it gets its Job.
func TestForkPullRequestJobsAreRefused(t *testing.T) {
	ctx, err := structpb.NewStruct(map[string]any{
		"event_name": "pull_request", "repository": "org/infra", "server_url": "https://gitea.example/",
		"event": map[string]any{"pull_request": map[string]any{
			"head": map[string]any{"repo_id": 9, "label": "feature"},
			"base": map[string]any{"repo_id": 7, "label": "main"},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte("on: pull_request\njobs:\n  j:\n    runs-on: sim\n    steps:\n      - run: echo from a fork\n")
	srv := &instanceServer{tasks: map[int64]*instanceTask{1: {ours: true}, 2: {ours: true}}}
	c := serveRunnerAPI(t, srv)
	tmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "runner:1"}}}}
	for _, run := range []bool{false, true} {
		kube := fake.NewClientBuilder().Build()
		s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d", Template: tmpl}, StepsImage: "steps:1", Namespace: "runners",
			Labels: []string{"sim"}, Logs: fileLogs(""), RunForkPullRequests: run})
		id := int64(1)
		if run {
			id = 2
		}
		_, made := s.makeJob(t.Context(), &runnerv1.Task{Id: id, WorkflowPayload: payload, Context: ctx})
		var jobs batchv1.JobList
		if err := kube.List(t.Context(), &jobs); err != nil {
			t.Fatal(err)
		}
		task := srv.tasks[id]
		refused := slices.ContainsFunc(task.rows, func(r string) bool {
			return strings.Contains(r, "a job of a pull request from a fork or by AGit flow is not run by this runner")
		})
		if made != run || len(jobs.Items) != map[bool]int{false: 0, true: 1}[run] || refused == run {
			t.Errorf("run %v: made %v, %d Jobs, refused %v (%v, log %q)", run, made, len(jobs.Items), refused, task.result, task.rows)
		}
		if !run && task.result != runnerv1.Result_RESULT_FAILURE {
			t.Errorf("the refused job: %v, want failure", task.result)
		}
	}
}

package gitea

import (
	"crypto/rand"
	"fmt"
	"maps"
	"slices"
	"strings"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"

	"github.com/runwarden/runwarden/internal/steps"
)

// PlanFor completes job's plan with what the task Gitea handed out holds:
// the github context, the secrets (the job's token among them), the
// variables, the needed jobs' results and outputs, and a marker of its own.
func PlanFor(task *runnerv1.Task, job *Job) steps.Plan {
	p := job.Plan
	if c := task.GetContext(); c != nil {
		p.Context = c.AsMap()
	}
	p.Secrets = maps.Clone(task.GetSecrets())
	p.Vars = maps.Clone(task.GetVars())
	if len(task.GetNeeds()) > 0 {
		p.Needs = map[string]steps.Need{}
		for id, n := range task.GetNeeds() {
			p.Needs[id] = steps.Need{Result: resultName(n.GetResult()), Outputs: maps.Clone(n.GetOutputs())}
		}
	}
	p.Marker = "::runwarden-" + strings.ToLower(rand.Text()) + "::"
	return p
}

// resultName is a result as expressions name it: "success", "failure",
// "cancelled", "skipped".
func resultName(r runnerv1.Result) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "RESULT_"))
}

// Template chooses the runner template of a job's runs-on labels from the
// platform's map of runner labels to templates: every label the job names
// must be one of the map's (Gitea hands a runner only jobs whose labels
// it declared) and all must name the same template.
func Template(runsOn []string, labels map[string]string) (string, error) {
	if len(runsOn) == 0 {
		return "", &Refusal{Step: -1, Reason: "the job has no runs-on labels"}
	}
	chosen := ""
	for _, l := range runsOn {
		t, ok := labels[l]
		if !ok {
			return "", &Refusal{Step: -1, Reason: fmt.Sprintf("runs-on %q: no runner template serves it (this runner's labels: %s)", l, strings.Join(slices.Sorted(maps.Keys(labels)), ", "))}
		}
		if chosen != "" && t != chosen {
			return "", &Refusal{Step: -1, Reason: fmt.Sprintf("runs-on %s: the labels name two runner templates, %s and %s; a job runs in one", strings.Join(runsOn, ", "), chosen, t)}
		}
		chosen = t
	}
	return chosen, nil
}

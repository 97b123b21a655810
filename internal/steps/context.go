package steps

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/nektos/act/pkg/exprparser"
	"github.com/nektos/act/pkg/model"
	"go.yaml.in/yaml/v4"
)

// contexts are what the job's expressions read: github (and its alias
// gitea), env, job, steps, secrets, vars and needs.
type contexts struct {
	env *exprparser.EvaluationEnvironment
	// run is the job with its needed jobs' results, which success() and
	// failure() read at the job's level.
	run *model.Run
}

// newContexts makes the contexts of plan's job, before any step ran.
func newContexts(plan *Plan) (*contexts, error) {
	gh := &model.GithubContext{}
	if len(plan.Context) > 0 {
		b, err := json.Marshal(plan.Context)
		if err != nil {
			return nil, fmt.Errorf("the job's github context: %w", err)
		}
		if err := json.Unmarshal(b, gh); err != nil {
			return nil, fmt.Errorf("the job's github context: %w", err)
		}
	}
	gh.Job = plan.Job
	if gh.Workspace == "" {
		gh.Workspace = plan.workspace()
	}
	needs := map[string]exprparser.Needs{}
	wf := &model.Workflow{Jobs: map[string]*model.Job{}}
	ids := slices.Sorted(maps.Keys(plan.Needs))
	for _, id := range ids {
		n := plan.Needs[id]
		needs[id] = exprparser.Needs{Result: n.Result, Outputs: n.Outputs}
		wf.Jobs[id] = &model.Job{Result: n.Result, Outputs: n.Outputs}
	}
	job := &model.Job{}
	if len(ids) > 0 {
		if err := job.RawNeeds.Encode(ids); err != nil {
			return nil, err
		}
	} else {
		job.RawNeeds = yaml.Node{}
	}
	wf.Jobs[plan.Job] = job
	return &contexts{
		env: &exprparser.EvaluationEnvironment{
			Github:  gh,
			Env:     map[string]string{},
			Job:     &model.JobContext{Status: "success"},
			Steps:   map[string]*model.StepResult{},
			Runner:  map[string]any{"os": "Linux", "temp": "", "tool_cache": ""},
			Secrets: nonNil(plan.Secrets),
			Vars:    nonNil(plan.Vars),
			Needs:   needs,
			Inputs:  inputs(gh),
		},
		run: &model.Run{Workflow: wf, JobID: plan.Job},
	}, nil
}

// config is the interpreter's configuration at a level.
func (c *contexts) config(level, dir string) exprparser.Config {
	return exprparser.Config{Run: c.run, Context: level, WorkingDir: dir}
}

// inputs are a workflow_dispatch's inputs, from its event.
func inputs(gh *model.GithubContext) map[string]any {
	if in, ok := gh.Event["inputs"].(map[string]any); ok {
		return in
	}
	return map[string]any{}
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// maxJobIf bounds a job-level if:, which the dispatcher evaluates.
const maxJobIf = 8 << 10

// JobRuns evaluates plan's job-level if: (success() by default: every
// needed job succeeded), as the job's runner must before it runs any step;
// false is a skipped job. It reads github, needs, vars and env, never
// secrets.
func JobRuns(plan *Plan) (bool, error) {
	if len(plan.If) > maxJobIf {
		// The dispatcher evaluates it, and the parser recurses once per
		// level of nesting.
		return false, fmt.Errorf("the job's if: is %d bytes; at most %d", len(plan.If), maxJobIf)
	}
	c, err := newContexts(plan)
	if err != nil {
		return false, err
	}
	c.env.Env = nonNil(plan.Env)
	// As in GitHub's jobs.<id>.if, the secrets context is not there: this
	// runs in the dispatcher, whose log would show an expression's error.
	c.env.Secrets = map[string]string{}
	ok, err := condition(c.env, c.config(levelJob, plan.workspace()), plan.If)
	if err != nil {
		return false, fmt.Errorf("the job's if: %w", err)
	}
	return ok, nil
}

func (p *Plan) workspace() string {
	if p.Workspace != "" {
		return p.Workspace
	}
	return "/workspace"
}

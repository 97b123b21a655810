package gitea

import (
	"bytes"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/nektos/act/pkg/model"

	"github.com/runwarden/runwarden/internal/steps"
)

// Job is what runwarden makes of one Gitea job: the plan its runner pod
// runs, and what shapes the pod.
type Job struct {
	Plan steps.Plan
	// RunsOn are the job's runs-on labels.
	RunsOn []string
	// Image is the job's container: image ("" for the template's).
	Image string
	// ContainerEnv is the job's container: env, plain values set on the
	// runner container (runwarden's secret references among them, resolved
	// in the pod as in any task's env).
	ContainerEnv map[string]string
	// TimeoutMinutes is the job's timeout-minutes ("" for the dispatcher's
	// default deadline).
	TimeoutMinutes string
}

// Refusal is a job runwarden does not run, and why: reported to Gitea as
// the job's failure with Reason in its log.
type Refusal struct {
	// Step is the index of the step refused, or -1 for the job.
	Step   int
	Reason string
}

func (r *Refusal) Error() string { return r.Reason }

// checkoutAction is the one action runwarden runs, natively.
const checkoutAction = "actions/checkout"

// ReadJob reads the single job of a Gitea task's workflow payload. A job
// using what runwarden does not run (uses: of an action other than
// actions/checkout, services:, a reusable workflow, container options,
// ports, volumes or credentials) is a *Refusal naming it.
func ReadJob(payload []byte) (*Job, error) {
	wf, err := model.ReadWorkflow(bytes.NewReader(payload))
	if err != nil {
		return nil, &Refusal{Step: -1, Reason: fmt.Sprintf("the workflow cannot be read: %v", err)}
	}
	ids := wf.GetJobIDs()
	if len(ids) != 1 {
		return nil, &Refusal{Step: -1, Reason: fmt.Sprintf("the task's workflow holds %d jobs, want one", len(ids))}
	}
	id := ids[0]
	mj := wf.Jobs[id]
	if mj.Uses != "" {
		return nil, refuseJob("jobs.%s.uses: %s: a reusable workflow is not supported; runwarden runs run: steps and actions/checkout", id, mj.Uses)
	}
	if len(mj.Services) > 0 {
		names := slices.Sorted(maps.Keys(mj.Services))
		return nil, refuseJob("jobs.%s.services (%s): service containers are not supported; a runner pod runs the job's steps in one container", id, strings.Join(names, ", "))
	}
	j := &Job{RunsOn: mj.RunsOn(), TimeoutMinutes: mj.TimeoutMinutes}
	if c := mj.Container(); c != nil {
		switch {
		case c.Options != "":
			return nil, refuseJob("jobs.%s.container.options: not supported; the platform's pod template shapes the runner pod", id)
		case len(c.Ports) > 0, len(c.Volumes) > 0:
			return nil, refuseJob("jobs.%s.container ports and volumes: not supported; the platform's pod template shapes the runner pod", id)
		case len(c.Credentials) > 0:
			return nil, refuseJob("jobs.%s.container.credentials: not supported; the runner pod pulls with the platform's image pull secrets", id)
		case strings.Contains(c.Image, "${{"):
			return nil, refuseJob("jobs.%s.container.image %q: an expression in the image is not supported; name the image", id, c.Image)
		}
		for _, k := range slices.Sorted(maps.Keys(c.Env)) {
			if strings.Contains(c.Env[k], "${{") {
				// The runner container's env is set as written: an
				// expression there would be taken literally.
				return nil, refuseJob("jobs.%s.container.env.%s: an expression is not supported in the container's env, which is set as written; use the job's or a step's env", id, k)
			}
		}
		j.Image, j.ContainerEnv = c.Image, c.Env
	}
	env := maps.Clone(wf.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, mj.Environment())
	defaults := steps.Defaults{Shell: wf.Defaults.Run.Shell, WorkingDirectory: wf.Defaults.Run.WorkingDirectory}
	if mj.Defaults.Run.Shell != "" {
		defaults.Shell = mj.Defaults.Run.Shell
	}
	if mj.Defaults.Run.WorkingDirectory != "" {
		defaults.WorkingDirectory = mj.Defaults.Run.WorkingDirectory
	}
	j.Plan = steps.Plan{
		Job: id, If: mj.If.Value, Env: env, Defaults: defaults, Outputs: mj.Outputs,
	}
	if len(mj.Steps) == 0 {
		return nil, refuseJob("jobs.%s has no steps", id)
	}
	if len(mj.Steps) > maxSteps {
		return nil, refuseJob("jobs.%s has %d steps; runwarden runs at most %d in a job", id, len(mj.Steps), maxSteps)
	}
	for i, ms := range mj.Steps {
		st, err := readStep(i, ms)
		if err != nil {
			return nil, err
		}
		j.Plan.Steps = append(j.Plan.Steps, st)
	}
	return j, nil
}

func refuseJob(format string, args ...any) *Refusal {
	return &Refusal{Step: -1, Reason: fmt.Sprintf(format, args...)}
}

// readStep reads step i, refusing what runwarden does not run.
func readStep(i int, ms *model.Step) (steps.Step, error) {
	st := steps.Step{
		ID: ms.ID, Name: StepName(ms), If: ms.If.Value, Run: ms.Run, Shell: ms.Shell,
		WorkingDirectory: ms.WorkingDirectory, Env: ms.Environment(),
		ContinueOnError: ms.RawContinueOnError, TimeoutMinutes: ms.TimeoutMinutes,
	}
	refuse := func(format string, args ...any) error {
		return &Refusal{Step: i, Reason: fmt.Sprintf("step %d (%s): ", i+1, st.Name) + fmt.Sprintf(format, args...)}
	}
	switch ms.Type() {
	case model.StepTypeRun:
		return st, nil
	case model.StepTypeUsesActionRemote:
		name, _, _ := strings.Cut(ms.Uses, "@")
		// Gitea's runner takes a URL too: https://host/actions/checkout@v4.
		if rest, ok := strings.CutPrefix(name, "https://"); ok {
			_, name, _ = strings.Cut(rest, "/")
		}
		if !strings.EqualFold(path.Clean(name), checkoutAction) {
			return st, refuse("uses: %s: actions are not supported; runwarden runs run: steps, and actions/checkout natively", ms.Uses)
		}
		for k := range ms.With {
			switch k {
			case "repository", "ref", "path", "token", "fetch-depth", "persist-credentials", "clean":
			default:
				return st, refuse("uses: %s with %s: not supported; runwarden's checkout takes repository, ref, path and token (and accepts fetch-depth, persist-credentials and clean: it always clones the ref's whole history, keeps no credentials and starts in a new workspace)", ms.Uses, k)
			}
		}
		st.Checkout = &steps.Checkout{Repository: ms.With["repository"], Ref: ms.With["ref"], Path: ms.With["path"], Token: ms.With["token"]}
		return st, nil
	case model.StepTypeUsesDockerURL:
		return st, refuse("uses: %s: docker:// actions are not supported; set the job's container: instead", ms.Uses)
	case model.StepTypeUsesActionLocal:
		return st, refuse("uses: %s: local actions are not supported; runwarden runs run: steps and actions/checkout", ms.Uses)
	case model.StepTypeReusableWorkflowLocal, model.StepTypeReusableWorkflowRemote:
		return st, refuse("uses: %s: reusable workflows are not supported", ms.Uses)
	default:
		return st, refuse("has neither run: nor uses:")
	}
}

// StepName is a step's name as Gitea shows it: its name:, else "Run " and
// its uses: or the first line of its run:.
func StepName(ms *model.Step) string {
	switch {
	case ms.Name != "":
		return ms.Name
	case ms.Uses != "":
		return "Run " + ms.Uses
	default:
		first, _, _ := strings.Cut(strings.TrimSpace(ms.Run), "\n")
		return "Run " + first
	}
}

// Timeout is the job's timeout-minutes in seconds (0: none given).
func (j *Job) Timeout() (int64, error) {
	v := strings.TrimSpace(j.TimeoutMinutes)
	if v == "" {
		return 0, nil
	}
	m, err := strconv.ParseFloat(v, 64)
	if err != nil || !(m > 0) || m > maxTimeoutMinutes {
		return 0, fmt.Errorf("the job's timeout-minutes %q: want a number of minutes above 0 and at most %d", v, maxTimeoutMinutes)
	}
	return max(int64(m*60), 1), nil
}

// maxTimeoutMinutes bounds a job's timeout-minutes: a year.
const maxTimeoutMinutes = 366 * 24 * 60

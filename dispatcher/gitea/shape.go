package gitea

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/internal/steps"
)

// The runner pod of a Gitea job: an init container copies the steps
// program (the dispatcher's own binary, `runwarden-dispatcher steps`) into
// a folder the runner container shares, so any image runs the steps; the
// runner container runs it with the plan from the task's Secret.
const (
	// StepsContainer is the init container's name.
	StepsContainer = "runwarden-steps"
	// stepsVolume holds the steps program; workspaceVolume the job's
	// workspace.
	stepsVolume     = "runwarden-steps"
	workspaceVolume = "runwarden-workspace"
	stepsDir        = "/runwarden/bin"
	// Workspace is where a job's steps run and check out.
	Workspace = "/runwarden/workspace"
	// PlanEnv is the runner container's variable holding the plan, set
	// from the task's Secret; the steps do not see it.
	PlanEnv = "RUNWARDEN_STEPS_PLAN"
	// stepsBinary is the program's name in stepsDir (as the dispatcher's
	// steps --install names it).
	stepsBinary = "runwarden-steps"
)

// PodTemplate is tmpl (a runner template) shaped to run Gitea jobs: the
// init container from stepsImage (the dispatcher's image), the shared
// folders, and the runner container running the steps program.
func PodTemplate(tmpl corev1.PodTemplateSpec, stepsImage string) (corev1.PodTemplateSpec, error) {
	t := *tmpl.DeepCopy()
	spec := &t.Spec
	i := slices.IndexFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == job.RunnerContainer })
	if i < 0 {
		return t, fmt.Errorf("%w: no container named %q", job.ErrInvalidTemplate, job.RunnerContainer)
	}
	if stepsImage == "" {
		return t, fmt.Errorf("%w: the Gitea source needs the image of its steps program (the dispatcher's)", job.ErrInvalidTemplate)
	}
	for _, v := range spec.Volumes {
		if v.Name == stepsVolume || v.Name == workspaceVolume {
			return t, fmt.Errorf("%w: the template names a volume %q, the Gitea source's own", job.ErrInvalidTemplate, v.Name)
		}
	}
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: stepsVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: workspaceVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	main := &spec.Containers[i]
	init := corev1.Container{
		Name: StepsContainer, Image: stepsImage,
		Args:            []string{"steps", "--install", stepsDir},
		ImagePullPolicy: main.ImagePullPolicy,
		VolumeMounts:    []corev1.VolumeMount{{Name: stepsVolume, MountPath: stepsDir}},
		// The runner's own limits and security context: nothing more.
		Resources:       main.Resources,
		SecurityContext: main.SecurityContext,
	}
	spec.InitContainers = append([]corev1.Container{init}, spec.InitContainers...)
	main.Command = []string{path.Join(stepsDir, stepsBinary)}
	main.Args = []string{"steps", "--plan-env", PlanEnv}
	main.WorkingDir = Workspace
	main.VolumeMounts = append(main.VolumeMounts,
		corev1.VolumeMount{Name: stepsVolume, MountPath: stepsDir, ReadOnly: true},
		corev1.VolumeMount{Name: workspaceVolume, MountPath: Workspace})
	return t, nil
}

// Task is the dispatcher's task for Gitea task id: the job's container
// image and env, its deadline, and its plan as a secret variable (into the
// task's Secret, never the Job).
func Task(id int64, namespace string, j *Job, plan steps.Plan) (job.Task, error) {
	t := job.Task{ID: taskID(id), Namespace: namespace, Image: j.Image, RepoURL: jobRepoURL(plan.Context)}
	plan.Workspace = Workspace
	plan.MaskEnv = nil
	untrusted := untrustedPullRequest(plan.Context)
	for _, k := range slices.Sorted(maps.Keys(j.ContainerEnv)) {
		v := j.ContainerEnv[k]
		if contract.HasSecretRef(v) {
			if untrusted != "" {
				return job.Task{}, &Refusal{Step: -1, Reason: fmt.Sprintf(
					"jobs.%s.container.env.%s: a secret reference in a job of %s is refused: Gitea gives such a job no secrets, and runwarden none either (pull_request_target runs the base's workflow with them)", plan.Job, k, untrusted)}
			}
			plan.MaskEnv = append(plan.MaskEnv, k)
		}
		t.Env = append(t.Env, corev1.EnvVar{Name: k, Value: v})
	}
	b, err := json.Marshal(plan)
	if err != nil {
		return job.Task{}, err
	}
	t.SourceSecretEnv = map[string]string{PlanEnv: string(b)}
	secs, err := j.Timeout()
	if err != nil {
		return job.Task{}, &Refusal{Step: -1, Reason: err.Error()}
	}
	if secs > 0 {
		t.ActiveDeadlineSeconds = &secs
	}
	return t, nil
}

// jobRepoURL is the job's repository as its checkout clones it, from the
// github context Gitea gave (its server_url and repository): the Job's
// runwarden.dev/repo-url, which --repo-allow and the platform's policies
// (gitURLAllowList, and any rule of theirs on the annotation) check as
// they do every source's task.
func jobRepoURL(ctx map[string]any) string {
	server, _ := ctx["server_url"].(string)
	repo, _ := ctx["repository"].(string)
	if server == "" || repo == "" {
		return ""
	}
	return steps.RepoURL(server, repo)
}

// The values of --gitea-fork-pull-requests.
const (
	ForkPullsRefuse = "refuse"
	ForkPullsRun    = "run"
)

// untrustedPullRequest names the pull request a job runs for when Gitea
// would give it no secrets ("" for any other job): one from a fork, one
// pushed by AGit flow (anyone who may read the repository may), or a
// comment's (whose payload does not say where the pull request's head
// is). Gitea keeps the pull request's flow to itself; the event's payload
// tells a pull request from a branch of the same repository (its head's
// repository the base's, and a head branch named), which is trusted as a
// push to that repository is. pull_request_target runs the base's
// workflow and is given secrets.
func untrustedPullRequest(ctx map[string]any) string {
	if ctx["event_name"] == "pull_request_target" {
		return ""
	}
	ev, _ := ctx["event"].(map[string]any)
	pr, ok := ev["pull_request"].(map[string]any)
	if !ok {
		if ev["is_pull"] == true {
			return "a comment on a pull request"
		}
		return ""
	}
	head, _ := pr["head"].(map[string]any)
	base, _ := pr["base"].(map[string]any)
	headRepo, _ := head["repo_id"].(float64)
	baseRepo, _ := base["repo_id"].(float64)
	label, _ := head["label"].(string)
	if headRepo == 0 || headRepo != baseRepo || label == "" {
		return "a pull request from a fork or by AGit flow"
	}
	return ""
}

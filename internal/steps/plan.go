// Package steps runs a Gitea Actions job's steps inside its runner pod: the
// job's plan (package dispatcher/gitea makes it from the task Gitea hands
// out) says what each step runs; this package decides, step by step, whether
// it runs (its if:), what it sees (its env, with ${{ }} expressions
// evaluated), runs it with its shell in its working directory within its
// time, reads what it writes to $GITHUB_OUTPUT, $GITHUB_ENV and
// $GITHUB_PATH, and tells the dispatcher where each step starts and ends,
// how it ended and the job's outputs, in marker lines on stdout beside the
// steps' own output. The pod's exit code is the job's result: 0 only when
// the job succeeded.
//
// Expressions are evaluated by the interpreter of Gitea's fork of act (the
// one Gitea's own runner uses), with the job's context as Gitea gave it.
package steps

// Plan is one job as the runner pod runs it. It holds the job's secrets and
// its token: the dispatcher puts it in the task's Secret, never in the Job.
type Plan struct {
	// Job is the job's ID in its workflow.
	Job string `json:"job"`
	// If is the job's if: ("" is success()).
	If string `json:"if,omitempty"`
	// Env is the workflow's env with the job's over it, unevaluated.
	Env map[string]string `json:"env,omitempty"`
	// Defaults are the job's defaults.run (over the workflow's).
	Defaults Defaults `json:"defaults,omitempty"`
	// Steps in order.
	Steps []Step `json:"steps"`
	// Outputs are the job's outputs, expressions over the steps' outputs,
	// evaluated once the steps ran.
	Outputs map[string]string `json:"outputs,omitempty"`
	// Context is the github context as Gitea gave it (event, sha, ref,
	// repository, server_url, ...).
	Context map[string]any `json:"context,omitempty"`
	// Secrets are the job's secrets (GITHUB_TOKEN and GITEA_TOKEN among
	// them), read only through ${{ secrets.NAME }}.
	Secrets map[string]string `json:"secrets,omitempty"`
	// Vars are the repository's and its owner's variables.
	Vars map[string]string `json:"vars,omitempty"`
	// Needs are the results and outputs of the jobs this one needs.
	Needs map[string]Need `json:"needs,omitempty"`
	// Marker begins every marker line: a value of this task's that the
	// steps' output does not hold by chance.
	Marker string `json:"marker"`
	// Workspace is the folder the steps run in by default, and checkouts
	// go to. Default: /workspace.
	Workspace string `json:"workspace,omitempty"`
	// MaskEnv names the variables of the container's environment whose
	// values are secrets (its secret references, resolved in the pod):
	// masked in the log as the secrets are.
	MaskEnv []string `json:"maskEnv,omitempty"`
}

// Defaults are a job's defaults for its run: steps.
type Defaults struct {
	Shell            string `json:"shell,omitempty"`
	WorkingDirectory string `json:"workingDirectory,omitempty"`
}

// Need is a needed job's result ("success", "failure", "cancelled",
// "skipped") and outputs.
type Need struct {
	Result  string            `json:"result"`
	Outputs map[string]string `json:"outputs,omitempty"`
}

// Step is one step of the job: a run: script or a checkout.
type Step struct {
	// ID is the step's id: (its outputs are steps.ID.outputs).
	ID string `json:"id,omitempty"`
	// Name is what the step is called in Gitea.
	Name string `json:"name"`
	// If is the step's if: ("" is success()).
	If string `json:"if,omitempty"`
	// Run is the script, with expressions in it.
	Run string `json:"run,omitempty"`
	// Shell is the step's shell: bash, sh, python, or a command line with
	// {0} for the script's file. Default: the job's default, else bash
	// when the image has it, else sh.
	Shell string `json:"shell,omitempty"`
	// WorkingDirectory is where the script runs, relative to the
	// workspace. Default: the job's default, else the workspace.
	WorkingDirectory string `json:"workingDirectory,omitempty"`
	// Env is the step's env, unevaluated.
	Env map[string]string `json:"env,omitempty"`
	// ContinueOnError is the step's continue-on-error, true, false or an
	// expression.
	ContinueOnError string `json:"continueOnError,omitempty"`
	// TimeoutMinutes is the step's timeout-minutes, a number or an
	// expression. Default: none (the job's deadline).
	TimeoutMinutes string `json:"timeoutMinutes,omitempty"`
	// Checkout, when set, makes the step a checkout of the job's
	// repository (actions/checkout) instead of a script.
	Checkout *Checkout `json:"checkout,omitempty"`
}

// Checkout is what an actions/checkout step's with: asks for; every value
// may hold expressions.
type Checkout struct {
	// Repository is owner/name. Default: the job's repository.
	Repository string `json:"repository,omitempty"`
	// Ref is a branch, tag or commit. Default: the job's commit.
	Ref string `json:"ref,omitempty"`
	// Path is where to, relative to the workspace. Default: the workspace.
	Path string `json:"path,omitempty"`
	// Token authenticates the clone. Default: the job's token.
	Token string `json:"token,omitempty"`
}

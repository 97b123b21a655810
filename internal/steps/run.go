package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nektos/act/pkg/model"
)

// Results, as Gitea and the expressions name them.
const (
	Success   = "success"
	Failure   = "failure"
	Cancelled = "cancelled"
	Skipped   = "skipped"
)

// Event is what one marker line says, after the plan's Marker and a space.
type Event struct {
	// Kind is "start" (a step starts), "end" (it ended), "outputs" (the
	// job's outputs) or "job" (the job ended).
	Kind string `json:"kind"`
	// Step is the step's index in the plan ("start", "end").
	Step int `json:"step"`
	// Result is how the step ended (its conclusion: a failure of a step
	// that may fail is a success), or how the job did.
	Result string `json:"result,omitempty"`
	// Outcome is how the step itself ended, before continue-on-error.
	Outcome string `json:"outcome,omitempty"`
	// Outputs are the job's outputs ("outputs").
	Outputs map[string]string `json:"outputs,omitempty"`
}

// Runner runs a plan's steps.
type Runner struct {
	Plan *Plan
	// Out receives the steps' output and the marker lines. Required.
	Out io.Writer
	// Environ is the environment every step starts from (the container's,
	// with its resolved secret references). Default: os.Environ().
	Environ []string
	// Temp is where scripts and the files of $GITHUB_OUTPUT, $GITHUB_ENV
	// and $GITHUB_PATH go. Default: a new folder in os.TempDir().
	Temp string
	// Checkout clones a repository for a checkout step. Default: Clone.
	Checkout func(ctx context.Context, c CloneOptions, out io.Writer) error

	mu sync.Mutex
	// midLine: the last output did not end its line.
	midLine bool
	// masks is what Out goes through once Run started.
	masks *masker
}

// Run runs the job's steps and returns its result (Success, Failure or
// Cancelled: Cancelled once ctx is done). A step runs when its if: says
// so; a failed step that may not fail makes the job's status failure, and
// later steps then run only if their if: asks for failure() or always().
func (r *Runner) Run(ctx context.Context) (string, error) {
	plan := r.Plan
	c, err := newContexts(plan)
	if err != nil {
		return Failure, err
	}
	if r.Environ == nil {
		r.Environ = os.Environ()
	}
	// Everything the job's log gets goes through the masker, in order.
	m := newMasker(r.Out)
	for _, v := range plan.Secrets {
		m.add(v)
	}
	for _, kv := range r.Environ {
		if k, v, _ := strings.Cut(kv, "="); slices.Contains(plan.MaskEnv, k) {
			m.add(v)
		}
	}
	r.Out, r.masks = m, m
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		_ = m.Flush()
	}()
	if r.Checkout == nil {
		r.Checkout = Clone
	}
	if r.Temp == "" {
		if r.Temp, err = os.MkdirTemp("", "runwarden-steps-"); err != nil {
			return Failure, err
		}
		defer func() { _ = os.RemoveAll(r.Temp) }()
	}
	ws := plan.workspace()
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return Failure, fmt.Errorf("the workspace: %w", err)
	}
	c.env.Runner["temp"] = r.Temp
	// The job's env is evaluated once, before the steps.
	jobEnv, err := evalEnv(c, levelJob, ws, plan.Env)
	if err != nil {
		r.say(fmt.Sprintf("the job's env: %v", err))
		return Failure, nil
	}
	s := &state{env: jobEnv, path: nil}
	for i := range plan.Steps {
		if ctx.Err() != nil && c.env.Job.Status != Cancelled {
			c.env.Job.Status = Cancelled
		}
		r.step(ctx, c, s, i)
	}
	outputs := map[string]string{}
	c.env.Env = s.env
	for _, name := range slices.Sorted(maps.Keys(plan.Outputs)) {
		v, err := interpolate(c.env, c.config(levelJob, ws), plan.Outputs[name])
		if err != nil {
			r.say(fmt.Sprintf("the job's output %s: %v", name, err))
			continue
		}
		if r.holdsSecret(v) {
			// As Gitea's runner: an output is not a way out for a secret.
			r.say(fmt.Sprintf("the job's output %s holds a secret; left out", name))
			continue
		}
		outputs[name] = v
	}
	if len(outputs) > 0 {
		r.mark(Event{Kind: "outputs", Outputs: outputs})
	}
	result := c.env.Job.Status
	r.mark(Event{Kind: "job", Result: result})
	return result, nil
}

// state is what the steps so far left for the next ones.
type state struct {
	// env is the job's env with what steps wrote to $GITHUB_ENV.
	env map[string]string
	// path are the folders steps wrote to $GITHUB_PATH, the latest first.
	path []string
}

// step runs step i, or skips it, and marks how it ended.
func (r *Runner) step(ctx context.Context, c *contexts, s *state, i int) {
	st := r.Plan.Steps[i]
	ws := r.Plan.workspace()
	key := st.ID
	if key == "" {
		key = "__" + strconv.Itoa(i)
	}
	c.env.Env = s.env
	run, err := condition(c.env, c.config(levelStep, ws), st.If)
	if err != nil {
		r.mark(Event{Kind: "start", Step: i})
		r.say(fmt.Sprintf("the step's if: %v", err))
		r.end(c, key, i, Failure, false)
		return
	}
	if !run {
		c.env.Steps[key] = &model.StepResult{Outputs: map[string]string{}, Outcome: model.StepStatusSkipped, Conclusion: model.StepStatusSkipped}
		r.mark(Event{Kind: "end", Step: i, Result: Skipped, Outcome: Skipped})
		return
	}
	r.mark(Event{Kind: "start", Step: i})
	stepEnv := maps.Clone(s.env)
	c.env.Env = stepEnv
	own, err := evalEnv(c, levelStep, ws, st.Env)
	if err == nil {
		maps.Copy(stepEnv, own)
	}
	mayFail, err2 := r.mayFail(c, st)
	if err = errors.Join(err, err2); err != nil {
		r.say(err.Error())
		r.end(c, key, i, Failure, false)
		return
	}
	timeout, err := r.timeout(c, st)
	if err != nil {
		r.say(err.Error())
		r.end(c, key, i, Failure, mayFail)
		return
	}
	// A step that runs once the job is cancelled (its if: asks for
	// cancelled() or always()) runs to its end: the pod's termination
	// grace period bounds it.
	base := ctx
	if ctx.Err() != nil {
		base = context.WithoutCancel(ctx)
	}
	sctx, cancel := base, context.CancelFunc(func() {})
	if timeout > 0 {
		sctx, cancel = context.WithTimeout(base, timeout)
	}
	defer cancel()
	files, err := newStepFiles(r.Temp, i)
	if err != nil {
		r.say(err.Error())
		r.end(c, key, i, Failure, mayFail)
		return
	}
	if st.Checkout != nil {
		err = r.checkout(sctx, c, st.Checkout)
	} else {
		err = r.script(sctx, c, s, st, stepEnv, files)
	}
	outcome := Success
	switch {
	case err == nil:
	case base.Err() != nil:
		r.say("the job was cancelled")
		outcome = Cancelled
	case sctx.Err() != nil:
		r.say(fmt.Sprintf("the step ran past its timeout-minutes (%s)", st.TimeoutMinutes))
		outcome = Failure
	default:
		r.say(err.Error())
		outcome = Failure
	}
	outputs, envs, paths, ferr := files.read()
	if ferr != nil {
		r.say(ferr.Error())
		if outcome == Success {
			outcome = Failure
		}
	}
	maps.Copy(s.env, envs)
	s.path = append(slices.Clone(paths), s.path...)
	c.env.Steps[key] = &model.StepResult{Outputs: outputs}
	r.end(c, key, i, outcome, mayFail)
}

// end records step i's outcome, and its conclusion: a failure of a step
// that may fail concludes as a success and leaves the job's status alone.
func (r *Runner) end(c *contexts, key string, i int, outcome string, mayFail bool) {
	conclusion := outcome
	if outcome == Failure && mayFail {
		conclusion = Success
	}
	res := c.env.Steps[key]
	if res == nil {
		res = &model.StepResult{Outputs: map[string]string{}}
		c.env.Steps[key] = res
	}
	res.Outcome, res.Conclusion = model.StepStatusFailure, model.StepStatusFailure
	if outcome == Success {
		res.Outcome = model.StepStatusSuccess
	}
	if conclusion == Success {
		res.Conclusion = model.StepStatusSuccess
	}
	switch {
	case conclusion == Cancelled:
		c.env.Job.Status = Cancelled
	case conclusion == Failure && c.env.Job.Status == Success:
		c.env.Job.Status = Failure
	}
	r.mark(Event{Kind: "end", Step: i, Result: conclusion, Outcome: outcome})
}

// mayFail evaluates the step's continue-on-error.
func (r *Runner) mayFail(c *contexts, st Step) (bool, error) {
	v := strings.TrimSpace(st.ContinueOnError)
	if v == "" {
		return false, nil
	}
	out, err := interpolate(c.env, c.config(levelStep, r.Plan.workspace()), v)
	if err != nil {
		return false, fmt.Errorf("the step's continue-on-error: %w", err)
	}
	b, err := strconv.ParseBool(strings.TrimSpace(out))
	if err != nil {
		return false, fmt.Errorf("the step's continue-on-error is %q: want true or false", out)
	}
	return b, nil
}

// timeout evaluates the step's timeout-minutes (0: none).
func (r *Runner) timeout(c *contexts, st Step) (time.Duration, error) {
	v := strings.TrimSpace(st.TimeoutMinutes)
	if v == "" {
		return 0, nil
	}
	out, err := interpolate(c.env, c.config(levelStep, r.Plan.workspace()), v)
	if err != nil {
		return 0, fmt.Errorf("the step's timeout-minutes: %w", err)
	}
	m, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil || m <= 0 {
		return 0, fmt.Errorf("the step's timeout-minutes is %q: want a number of minutes above 0", out)
	}
	return time.Duration(m * float64(time.Minute)), nil
}

// script runs a run: step with its shell.
func (r *Runner) script(ctx context.Context, c *contexts, s *state, st Step, env map[string]string, files *stepFiles) error {
	ws := r.Plan.workspace()
	body, err := interpolate(c.env, c.config(levelStep, ws), st.Run)
	if err != nil {
		return fmt.Errorf("the step's run: %w", err)
	}
	dir := firstOf(st.WorkingDirectory, r.Plan.Defaults.WorkingDirectory)
	if dir, err = interpolate(c.env, c.config(levelStep, ws), dir); err != nil {
		return fmt.Errorf("the step's working-directory: %w", err)
	}
	dir = inWorkspace(ws, dir)
	shell := firstOf(st.Shell, r.Plan.Defaults.Shell)
	argv, ext := shellCommand(shell)
	file := filepath.Join(r.Temp, fmt.Sprintf("step-%d%s", files.index, ext))
	if err := os.WriteFile(file, []byte(body), 0o700); err != nil {
		return err
	}
	args := make([]string, 0, len(argv)+1)
	placed := false
	for _, a := range argv {
		if strings.Contains(a, "{0}") {
			a, placed = strings.ReplaceAll(a, "{0}", file), true
		}
		args = append(args, a)
	}
	if !placed {
		args = append(args, file)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = r.stepEnviron(s, env, files)
	// The step and whatever it starts are one process group, ended
	// together when the step is cancelled or times out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	w := &lockedWriter{r: r}
	cmd.Stdout, cmd.Stderr = w, w
	if _, err := exec.LookPath(args[0]); err != nil && !strings.Contains(args[0], "/") {
		return fmt.Errorf("the step's shell %q is not in the image: %w", args[0], err)
	}
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && ctx.Err() == nil {
			return fmt.Errorf("the step exited with code %d", exit.ExitCode())
		}
		return err
	}
	return nil
}

// stepEnviron is a step's process environment: the container's, the
// variables every step gets, the job's and the step's env, and PATH with
// what earlier steps added to $GITHUB_PATH before it.
func (r *Runner) stepEnviron(s *state, env map[string]string, files *stepFiles) []string {
	gh := r.Plan.Context
	str := func(k string) string { v, _ := gh[k].(string); return v }
	vars := map[string]string{
		"CI": "true", "GITHUB_ACTIONS": "true", "GITEA_ACTIONS": "true",
		"GITHUB_WORKSPACE": r.Plan.workspace(), "GITHUB_JOB": r.Plan.Job,
		"GITHUB_SHA": str("sha"), "GITHUB_REF": str("ref"), "GITHUB_REF_NAME": str("ref_name"),
		"GITHUB_REPOSITORY": str("repository"), "GITHUB_REPOSITORY_OWNER": str("repository_owner"),
		"GITHUB_SERVER_URL": str("server_url"), "GITHUB_API_URL": str("api_url"),
		"GITHUB_RUN_ID": str("run_id"), "GITHUB_RUN_NUMBER": str("run_number"),
		"GITHUB_EVENT_NAME": str("event_name"), "GITHUB_ACTOR": str("actor"),
		"GITHUB_OUTPUT": files.output, "GITHUB_ENV": files.env, "GITHUB_PATH": files.path,
		"RUNNER_TEMP": r.Temp, "RUNNER_OS": "Linux",
	}
	out := make([]string, 0, len(r.Environ)+len(vars)+len(env))
	var path string
	for _, kv := range r.Environ {
		k, v, _ := strings.Cut(kv, "=")
		if k == "PATH" {
			path = v
			continue
		}
		if _, ok := vars[k]; ok {
			continue
		}
		if _, ok := env[k]; ok {
			continue
		}
		out = append(out, kv)
	}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if _, ok := env[k]; !ok {
			out = append(out, k+"="+vars[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if k == "PATH" {
			path = env[k]
			continue
		}
		out = append(out, k+"="+env[k])
	}
	if len(s.path) > 0 {
		path = strings.Join(append(slices.Clone(s.path), path), string(os.PathListSeparator))
	}
	return append(out, "PATH="+path)
}

// shellCommand is the command line of a shell: and the script file's
// extension. No shell: bash when the image has it, else sh (GitHub
// Actions' rule on Linux).
func shellCommand(shell string) ([]string, string) {
	if shell == "" {
		shell = "sh"
		if _, err := exec.LookPath("bash"); err == nil {
			shell = "bash"
		}
	}
	ext := ".sh"
	if shell == "python" {
		ext = ".py"
	}
	return strings.Fields((&model.Step{Shell: shell}).ShellCommand()), ext
}

// checkout clones the job's repository, or the one the step names.
func (r *Runner) checkout(ctx context.Context, c *contexts, co *Checkout) error {
	ws := r.Plan.workspace()
	cfg := c.config(levelStep, ws)
	var vals [4]string
	for i, v := range []string{co.Repository, co.Ref, co.Path, co.Token} {
		out, err := interpolate(c.env, cfg, v)
		if err != nil {
			return fmt.Errorf("the checkout's with: %w", err)
		}
		vals[i] = out
	}
	gh := c.env.Github
	opts := CloneOptions{
		Server: gh.ServerURL, Repository: firstOf(vals[0], gh.Repository),
		Ref: vals[1], Dir: inWorkspace(ws, vals[2]), Token: firstOf(vals[3], gh.Token, r.Plan.Secrets["GITEA_TOKEN"], r.Plan.Secrets["GITHUB_TOKEN"]),
	}
	if vals[0] == "" && vals[1] == "" {
		opts.Ref, opts.Commit = gh.Ref, gh.Sha
	}
	return r.Checkout(ctx, opts, &lockedWriter{r: r})
}

// evalEnv evaluates env's values at level.
func evalEnv(c *contexts, level, ws string, env map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v, err := interpolate(c.env, c.config(level, ws), env[k])
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

// inWorkspace resolves dir against the workspace.
func inWorkspace(ws, dir string) string {
	if dir == "" {
		return ws
	}
	if filepath.IsAbs(dir) {
		return filepath.Clean(dir)
	}
	return filepath.Join(ws, dir)
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// holdsSecret tells whether v holds a value the log masks.
func (r *Runner) holdsSecret(v string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.masks != nil && r.masks.holds(v)
}

// mark writes a marker line.
func (r *Runner) mark(e Event) {
	b, _ := json.Marshal(e)
	r.line(r.Plan.Marker + " " + string(b))
}

// say writes a line of runwarden's own about the job into its log.
func (r *Runner) say(msg string) {
	r.line("runwarden: " + msg)
}

// line writes s as a line of its own: after a newline when a step's
// output did not end with one, so a marker always begins its line.
func (r *Runner) line(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.midLine {
		s = "\n" + s
	}
	_, _ = io.WriteString(r.Out, s+"\n")
	r.midLine = false
}

// lockedWriter writes a step's output to Out between marker lines.
type lockedWriter struct{ r *Runner }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	n, err := w.r.Out.Write(p)
	if n > 0 {
		w.r.midLine = p[n-1] != '\n'
	}
	return n, err
}

package gitea

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestReadJob(t *testing.T) {
	j, err := ReadJob([]byte(`
name: deploy
on: push
env:
  STAGE: prod
  SHARED: workflow
jobs:
  apply:
    runs-on: [tofu]
    timeout-minutes: 30
    container:
      image: registry.example/tofu:1.12
      env:
        TF_VAR_db_password: ${vault:secret/db.password}
    env:
      SHARED: job
    defaults:
      run:
        shell: sh
        working-directory: infra
    outputs:
      plan: ${{ steps.plan.outputs.summary }}
    steps:
      - uses: actions/checkout@v4
        with:
          path: src
      - id: plan
        run: |
          tofu plan
          echo "summary=ok" >> "$GITHUB_OUTPUT"
        env:
          TF_IN_AUTOMATION: "1"
        continue-on-error: true
        timeout-minutes: 5
      - name: Tell
        if: always()
        run: echo done
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(j.RunsOn, ","); got != "tofu" {
		t.Errorf("runs-on %q", got)
	}
	if j.Image != "registry.example/tofu:1.12" || j.ContainerEnv["TF_VAR_db_password"] != "${vault:secret/db.password}" {
		t.Errorf("container %q %q", j.Image, j.ContainerEnv)
	}
	if s, err := j.Timeout(); err != nil || s != 1800 {
		t.Errorf("timeout %d, %v", s, err)
	}
	p := j.Plan
	if p.Job != "apply" || p.Env["STAGE"] != "prod" || p.Env["SHARED"] != "job" {
		t.Errorf("plan job %q env %q", p.Job, p.Env)
	}
	if p.Defaults.Shell != "sh" || p.Defaults.WorkingDirectory != "infra" {
		t.Errorf("defaults %+v", p.Defaults)
	}
	if p.Outputs["plan"] != "${{ steps.plan.outputs.summary }}" {
		t.Errorf("outputs %q", p.Outputs)
	}
	if len(p.Steps) != 3 {
		t.Fatalf("%d steps", len(p.Steps))
	}
	if c := p.Steps[0].Checkout; c == nil || c.Path != "src" {
		t.Errorf("checkout %+v", c)
	}
	s := p.Steps[1]
	if s.ID != "plan" || !strings.Contains(s.Run, "tofu plan") || s.Env["TF_IN_AUTOMATION"] != "1" || s.ContinueOnError != "true" || s.TimeoutMinutes != "5" || s.Name != "Run tofu plan" {
		t.Errorf("step 2 %+v", s)
	}
	if s := p.Steps[2]; s.Name != "Tell" || s.If != "always()" {
		t.Errorf("step 3 %+v", s)
	}
}

func TestReadJobRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
		step             int
	}{
		{"an action", "steps:\n  - uses: actions/setup-go@v5\n", "step 1 (Run actions/setup-go@v5): uses: actions/setup-go@v5: actions are not supported", 0},
		{"a docker action", "steps:\n  - run: true\n  - uses: docker://alpine\n", "step 2 (Run docker://alpine): uses: docker://alpine: docker:// actions are not supported", 1},
		{"a local action", "steps:\n  - uses: ./my-action\n", "local actions are not supported", 0},
		{"checkout with an unknown input", "steps:\n  - uses: actions/checkout@v4\n    with:\n      submodules: true\n", "with submodules: not supported", 0},
		{"services", "services:\n  db:\n    image: postgres\nsteps:\n  - run: true\n", "jobs.j.services (db): service containers are not supported", -1},
		{"container options", "container:\n  image: alpine\n  options: --privileged\nsteps:\n  - run: true\n", "container.options: not supported", -1},
		{"container volumes", "container:\n  image: alpine\n  volumes: [/var/run/docker.sock:/var/run/docker.sock]\nsteps:\n  - run: true\n", "ports and volumes: not supported", -1},
		{"an image expression", "container: ${{ vars.IMAGE }}\nsteps:\n  - run: true\n", "an expression in the image is not supported", -1},
		{"an expression in the container's env", "container:\n  image: alpine\n  env:\n    TOKEN: ${{ secrets.TOKEN }}\nsteps:\n  - run: true\n", "container.env.TOKEN: an expression is not supported", -1},
		{"no steps", "steps: []\n", "jobs.j has no steps", -1},
		{"more steps than a record holds", "steps:\n" + strings.Repeat("  - run: true\n", maxSteps+1), fmt.Sprintf("jobs.j has %d steps; runwarden runs at most %d", maxSteps+1, maxSteps), -1},
		{"a step with nothing", "steps:\n  - name: empty\n", "step 1 (empty): has neither run: nor uses:", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := "on: push\njobs:\n  j:\n    runs-on: x\n" + indent(tc.yaml, "    ")
			_, err := ReadJob([]byte(body))
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("error %v, want a refusal", err)
			}
			if !strings.Contains(r.Reason, tc.want) || r.Step != tc.step {
				t.Errorf("refusal %q at step %d, want %q at %d", r.Reason, r.Step, tc.want, tc.step)
			}
		})
	}
	for name, payload := range map[string]string{
		"two jobs": "on: push\njobs:\n  a:\n    runs-on: x\n    steps: [{run: 'true'}]\n  b:\n    runs-on: x\n    steps: [{run: 'true'}]\n",
		"not yaml": "{{{",
		"reusable": "on: push\njobs:\n  a:\n    uses: org/repo/.gitea/workflows/w.yml@main\n",
	} {
		var r *Refusal
		if _, err := ReadJob([]byte(payload)); !errors.As(err, &r) {
			t.Errorf("%s: error %v, want a refusal", name, err)
		}
	}
}

// TestTimeout: a job's timeout-minutes is its Job's deadline in whole
// seconds, at least one; what is not a number of minutes above 0, or is
// past a year, is refused rather than taken for no deadline.
func TestTimeout(t *testing.T) {
	for v, want := range map[string]int64{"": 0, "30": 1800, "1.5": 90, "0.001": 1, "527040": 527040 * 60} {
		if got, err := (&Job{TimeoutMinutes: v}).Timeout(); err != nil || got != want {
			t.Errorf("timeout-minutes %q: %d, %v; want %d", v, got, err, want)
		}
	}
	for _, v := range []string{"0", "-5", "NaN", "Inf", "+Inf", "1e300", "527041", "soon", "${{ vars.T }}"} {
		if got, err := (&Job{TimeoutMinutes: v}).Timeout(); err == nil {
			t.Errorf("timeout-minutes %q: %d seconds, want refused", v, got)
		}
	}
}

func indent(s, by string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = by + l
	}
	return strings.Join(lines, "\n") + "\n"
}

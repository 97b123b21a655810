package steps

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const testMarker = "::rw-test::"

// run runs plan's steps in a temporary workspace and returns the job's
// result, the events in order and the other lines of the log.
func run(ctx context.Context, t *testing.T, plan *Plan) (string, []Event, []string) {
	t.Helper()
	plan.Marker = testMarker
	if plan.Workspace == "" {
		plan.Workspace = t.TempDir()
	}
	var out strings.Builder
	r := &Runner{Plan: plan, Out: &out, Temp: t.TempDir(), Environ: []string{"PATH=" + os.Getenv("PATH"), "HOME=/tmp"}}
	result, err := r.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	events, lines := parse(t, out.String())
	return result, events, lines
}

func parse(t *testing.T, log string) ([]Event, []string) {
	t.Helper()
	var events []Event
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, testMarker+" "); ok {
			var e Event
			if err := json.Unmarshal([]byte(rest), &e); err != nil {
				t.Fatalf("marker line %q: %v", l, err)
			}
			events = append(events, e)
			continue
		}
		if strings.Contains(l, testMarker) {
			t.Fatalf("a marker in the middle of a line: %q", l)
		}
		lines = append(lines, l)
	}
	return events, lines
}

// outputsOf is the job's outputs as its last outputs marker says.
func outputsOf(events []Event) map[string]string {
	var outputs map[string]string
	for _, e := range events {
		if e.Kind == "outputs" {
			outputs = e.Outputs
		}
	}
	return outputs
}

// ends are the steps' results in the order they ended, "-" for none.
func ends(events []Event, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "-"
	}
	for _, e := range events {
		if e.Kind == "end" {
			out[e.Step] = e.Result
		}
	}
	return out
}

func TestStepsRunInOrderAndFailureStopsTheRest(t *testing.T) {
	plan := &Plan{
		Job: "build",
		Env: map[string]string{"GREETING": "hello ${{ github.repository }}"},
		Steps: []Step{
			{ID: "first", Name: "first", Run: `echo "$GREETING"; echo "x=from first" >> "$GITHUB_OUTPUT"; printf 'no newline'`},
			{Name: "fails", Run: "echo failing; exit 3"},
			{Name: "not run", Run: "echo should not run"},
			{Name: "always", If: "always()", Run: `echo "saw ${{ steps.first.outputs.x }} and ${{ job.status }}"`},
			{Name: "on failure", If: "${{ failure() }}", Run: "echo on failure"},
			{Name: "on success", If: "success()", Run: "echo on success"},
		},
		Context: map[string]any{"repository": "team/app"},
	}
	result, events, lines := run(context.Background(), t, plan)
	if result != Failure {
		t.Errorf("result %q, want failure", result)
	}
	if got, want := strings.Join(ends(events, 6), ","), "success,failure,skipped,success,success,skipped"; got != want {
		t.Errorf("steps ended %s, want %s", got, want)
	}
	log := strings.Join(lines, "\n")
	for _, want := range []string{"hello team/app", "no newline", "failing", "runwarden: the step exited with code 3", "saw from first and failure", "on failure"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
	for _, not := range []string{"should not run", "on success"} {
		if strings.Contains(log, not) {
			t.Errorf("the log has %q:\n%s", not, log)
		}
	}
	if last := events[len(events)-1]; last.Kind != "job" || last.Result != Failure {
		t.Errorf("last event %+v, want the job's failure", last)
	}
	// Every step that ran has its start before its end, in order.
	var order []string
	for _, e := range events {
		if e.Kind == "start" || e.Kind == "end" {
			order = append(order, e.Kind+string(rune('0'+e.Step)))
		}
	}
	if got, want := strings.Join(order, " "), "start0 end0 start1 end1 end2 start3 end3 start4 end4 end5"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
}

func TestContinueOnErrorAndOutputs(t *testing.T) {
	plan := &Plan{
		Job: "j",
		Steps: []Step{
			{ID: "a", Name: "may fail", ContinueOnError: "${{ 'true' }}", Run: "exit 1"},
			{ID: "b", Name: "outputs", Run: "printf 'multi<<EOF\\nline 1\\nline 2\\nEOF\\n' >> \"$GITHUB_OUTPUT\"\necho 'NEXT=from b' >> \"$GITHUB_ENV\"\nmkdir -p \"$RUNNER_TEMP/bin\" && printf '#!/bin/sh\\necho tool ran\\n' > \"$RUNNER_TEMP/bin/mytool\" && chmod +x \"$RUNNER_TEMP/bin/mytool\" && echo \"$RUNNER_TEMP/bin\" >> \"$GITHUB_PATH\""},
			{Name: "reads", Run: `echo "next=$NEXT outcome=${{ steps.a.outcome }} conclusion=${{ steps.a.conclusion }}"; mytool`},
		},
		Outputs: map[string]string{"lines": "${{ steps.b.outputs.multi }}", "status": "${{ job.status }}"},
	}
	result, events, lines := run(context.Background(), t, plan)
	if result != Success {
		t.Fatalf("result %q, want success:\n%s", result, strings.Join(lines, "\n"))
	}
	if got, want := strings.Join(ends(events, 3), ","), "success,success,success"; got != want {
		t.Errorf("steps ended %s, want %s", got, want)
	}
	if events[1].Outcome != Failure {
		t.Errorf("the failed step that may fail: outcome %q, want failure", events[1].Outcome)
	}
	log := strings.Join(lines, "\n")
	for _, want := range []string{"next=from b outcome=failure conclusion=success", "tool ran"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
	outputs := outputsOf(events)
	if outputs["lines"] != "line 1\nline 2" || outputs["status"] != "success" {
		t.Errorf("job outputs %q", outputs)
	}
}

func TestStepTimeoutAndWorkingDirectory(t *testing.T) {
	ws := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	plan := &Plan{
		Job: "j", Workspace: ws,
		Defaults: Defaults{WorkingDirectory: "sub"},
		Steps: []Step{
			{Name: "slow", TimeoutMinutes: "0.05", Run: "sleep 600 & echo $! > " + pidFile + "; wait"},
			{Name: "where", If: "always()", Shell: "sh", Run: "pwd"},
		},
	}
	result, events, lines := run(context.Background(), t, plan)
	if result != Failure || ends(events, 2)[0] != Failure {
		t.Errorf("result %q, steps %v: want the slow step's failure", result, ends(events, 2))
	}
	log := strings.Join(lines, "\n")
	if !strings.Contains(log, "runwarden: the step ran past its timeout-minutes (0.05)") {
		t.Errorf("the log does not say why:\n%s", log)
	}
	if !strings.Contains(log, filepath.Join(ws, "sub")) {
		t.Errorf("the step did not run in the default working directory:\n%s", log)
	}
	// What the step started ended with it.
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the slow step did not start its child within its 3 s: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("the step's child %d still runs after the step timed out", pid)
	}
}

// alive says process pid runs (a zombie waiting for its parent does not).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}

func TestCancelledJobRunsOnlyWhatAsksForIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	// The first step says it runs through a FIFO; the job is cancelled
	// then.
	started := filepath.Join(t.TempDir(), "started")
	if err := syscall.Mkfifo(started, 0o600); err != nil {
		t.Fatal(err)
	}
	plan := &Plan{
		Job: "j",
		Steps: []Step{
			{Name: "long", Run: "echo running > " + started + "; sleep 600 & wait"},
			{Name: "normal", Run: "echo normal"},
			{Name: "on cancel", If: "cancelled()", Run: "echo on cancel"},
		},
	}
	go func() {
		_, _ = os.ReadFile(started)
		cancel()
	}()
	result, events, lines := run(ctx, t, plan)
	if result != Cancelled {
		t.Errorf("result %q, want cancelled", result)
	}
	if got, want := strings.Join(ends(events, 3), ","), "cancelled,skipped,success"; got != want {
		t.Errorf("steps ended %s, want %s", got, want)
	}
	log := strings.Join(lines, "\n")
	if !strings.Contains(log, "runwarden: the job was cancelled") || !strings.Contains(log, "on cancel") {
		t.Errorf("the log does not show the cancel and the step run after it:\n%s", log)
	}
}

func TestJobRuns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plan  Plan
		want  bool
		error string
	}{
		{"no needs", Plan{Job: "j"}, true, ""},
		{"needs succeeded", Plan{Job: "j", Needs: map[string]Need{"a": {Result: "success"}}}, true, ""},
		{"a need failed", Plan{Job: "j", Needs: map[string]Need{"a": {Result: "success"}, "b": {Result: "failure"}}}, false, ""},
		{"if failure()", Plan{Job: "j", If: "failure()", Needs: map[string]Need{"b": {Result: "failure"}}}, true, ""},
		{"if on an output", Plan{Job: "j", If: "needs.a.outputs.go == 'yes'", Needs: map[string]Need{"a": {Result: "success", Outputs: map[string]string{"go": "yes"}}}}, true, ""},
		{"if on a variable", Plan{Job: "j", If: "${{ vars.DEPLOY == 'on' && github.ref == 'refs/heads/main' }}", Vars: map[string]string{"DEPLOY": "on"}, Context: map[string]any{"ref": "refs/heads/main"}}, true, ""},
		{"false", Plan{Job: "j", If: "github.event_name == 'schedule'", Context: map[string]any{"event_name": "push"}}, false, ""},
		{"bad expression", Plan{Job: "j", If: "github.ref =="}, false, "the job's if"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := JobRuns(&tc.plan)
			if tc.error != "" {
				if err == nil || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("error %v, want one with %q", err, tc.error)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("JobRuns = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestInterpolate(t *testing.T) {
	c, err := newContexts(&Plan{Job: "j", Secrets: map[string]string{"S": "s3cret"}, Context: map[string]any{"event": map[string]any{"n": 2.0, "list": []any{"a"}}}})
	if err != nil {
		t.Fatal(err)
	}
	c.env.Env = map[string]string{"A": "va"}
	for in, want := range map[string]string{
		"plain":                                "plain",
		"${{ env.A }}":                         "va",
		"x ${{ env.A }} y ${{ secrets.S }} z":  "x va y s3cret z",
		"${{ 'a}}b' }}":                        "a}}b",
		"${{ format('{0}-{1}', 'x', env.A) }}": "x-va",
		"${{ github.event.n }}":                "2",
		"${{ toJSON(github.event.list) }}":     "[\n  \"a\"\n]",
		"${{ env.MISSING }}|":                  "|",
		"${{ true }} ${{ 1.5 }}":               "true 1.5",
		"$ {{ not }} ${ {x} }":                 "$ {{ not }} ${ {x} }",
		"${{ contains('abc', 'b') && 'yes' }}": "yes",
	} {
		got, err := interpolate(c.env, c.config(levelStep, "/"), in)
		if err != nil || got != want {
			t.Errorf("interpolate(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"${{ env.A", "${{ nosuch.x }}", "${{ a == }}"} {
		if got, err := interpolate(c.env, c.config(levelStep, "/"), bad); err == nil {
			t.Errorf("interpolate(%q) = %q, want an error", bad, got)
		}
	}
}

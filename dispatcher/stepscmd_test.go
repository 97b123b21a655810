package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runwarden/runwarden/internal/steps"
)

func TestStepsCommand(t *testing.T) {
	dir := t.TempDir()
	plan := steps.Plan{
		Job: "j", Marker: "::rw-m::", Workspace: t.TempDir(),
		Steps: []steps.Step{{Name: "hello", Shell: "sh", Run: "echo hello ${{ vars.WHO }}"}},
		Vars:  map[string]string{"WHO": "world"},
	}
	b, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "plan.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"steps", "--plan", file}, &out, &errOut); code != 0 {
		t.Fatalf("steps --plan: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "hello world\n") || !strings.Contains(out.String(), `::rw-m:: {"kind":"job","step":0,"result":"success"}`) {
		t.Errorf("steps --plan printed:\n%s", out.String())
	}
	// A failing job exits 1; a plan that cannot be read, 2.
	plan.Steps[0].Run = "exit 4"
	b, _ = json.Marshal(plan)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := run(context.Background(), []string{"steps", "--plan", file}, &out, &errOut); code != 1 {
		t.Errorf("a failing job: exit %d, want 1", code)
	}
	if code := run(context.Background(), []string{"steps", "--plan", filepath.Join(dir, "none")}, &out, &errOut); code != 2 {
		t.Errorf("a missing plan: exit %d, want 2", code)
	}
	for _, args := range [][]string{{"steps"}, {"steps", "--plan", file, "--install", dir}, {"steps", "extra"}} {
		errOut.Reset()
		if code := run(context.Background(), args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
	// --plan-env reads the plan from a variable the steps do not see.
	plan.Steps[0].Run = `echo "hello ${{ vars.WHO }}, plan=[${RW_TEST_PLAN:-}]"`
	b, _ = json.Marshal(plan)
	t.Setenv("RW_TEST_PLAN", string(b))
	out.Reset()
	if code := run(context.Background(), []string{"steps", "--plan-env", "RW_TEST_PLAN"}, &out, &errOut); code != 0 {
		t.Fatalf("steps --plan-env: exit %d\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "hello world, plan=[]\n") {
		t.Errorf("steps --plan-env printed (the plan must not reach the steps):\n%s", out.String())
	}
	if code := run(context.Background(), []string{"steps", "--plan-env", "RW_TEST_NO_SUCH"}, &out, &errOut); code != 2 {
		t.Errorf("an unset plan variable: exit %d, want 2", code)
	}
	// --install copies this program.
	into := t.TempDir()
	if code := run(context.Background(), []string{"steps", "--install", into}, &out, &errOut); code != 0 {
		t.Fatalf("steps --install: exit %d: %s", code, errOut.String())
	}
	self, _ := os.Executable()
	want, _ := os.ReadFile(self)
	got, err := os.ReadFile(filepath.Join(into, stepsBinary))
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("steps --install did not copy this program (%d bytes, %v)", len(got), err)
	}
	if fi, err := os.Stat(filepath.Join(into, stepsBinary)); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("the installed program is not executable: %v", fi.Mode())
	}
}

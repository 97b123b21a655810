package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/runwarden/runwarden/internal/steps"
)

// stepsBinary is the name the steps command is installed under in a runner
// pod's shared folder.
const stepsBinary = "runwarden-steps"

// stepsCmd is `runwarden-dispatcher steps`: in a Gitea Actions job's
// runner pod, run the job's steps from its plan (--plan), or copy this
// binary into a folder the runner container shares (--install), which an
// init container does so any image can run the steps.
func stepsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("runwarden-dispatcher steps", flag.ContinueOnError)
	fs.SetOutput(stderr)
	plan := fs.String("plan", "", "run the steps of the job plan in this file (JSON, from the task's Secret); exit 0 only when the job succeeded")
	planEnv := fs.String("plan-env", "", "run the steps of the job plan in this environment variable (set from the task's Secret); the steps do not see it")
	install := fs.String("install", "", "copy this program into this folder as "+stepsBinary+", and stop")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "Usage: runwarden-dispatcher steps --plan FILE | --plan-env NAME | --install DIR\n\nRuns a Gitea Actions job's steps in its runner pod (see docs/gitea.md).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	given := 0
	for _, v := range []string{*plan, *planEnv, *install} {
		if v != "" {
			given++
		}
	}
	switch {
	case fs.NArg() > 0:
		_, _ = fmt.Fprintf(stderr, "runwarden-dispatcher steps: unexpected arguments %q\n", fs.Args())
		return 2
	case given != 1:
		_, _ = fmt.Fprintln(stderr, "runwarden-dispatcher steps: give one of --plan, --plan-env and --install")
		return 2
	case *install != "":
		if err := installSelf(*install); err != nil {
			_, _ = fmt.Fprintf(stderr, "runwarden-dispatcher steps: %v\n", err)
			return 1
		}
		return 0
	case *planEnv != "":
		data, ok := os.LookupEnv(*planEnv)
		if !ok {
			_, _ = fmt.Fprintf(stdout, "runwarden: the job's plan: $%s is not set\n", *planEnv)
			return 2
		}
		// The steps start from this environment without the plan: its
		// secrets reach a step only through ${{ secrets.NAME }}.
		environ := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, *planEnv+"=") })
		return steps.RunPlan(ctx, []byte(data), environ, stdout)
	}
	return steps.RunFile(ctx, *plan, stdout)
}

// installSelf copies the running program into dir as stepsBinary.
func installSelf(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	dst := filepath.Join(dir, stepsBinary)
	tmp, err := os.CreateTemp(dir, "."+stepsBinary+"-")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := io.Copy(tmp, in); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("copying %s into %s: %w", self, dir, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

package steps

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// RunFile runs the plan in file (JSON, as the dispatcher writes it into the
// task's Secret) with out as the log, and returns the process's exit code:
// 0 only when the job succeeded.
func RunFile(ctx context.Context, file string, out io.Writer) int {
	b, err := os.ReadFile(file)
	if err != nil {
		_, _ = fmt.Fprintf(out, "runwarden: the job's plan: %v\n", err)
		return 2
	}
	var plan Plan
	if err := json.Unmarshal(b, &plan); err != nil {
		_, _ = fmt.Fprintf(out, "runwarden: the job's plan %s: %v\n", file, err)
		return 2
	}
	if plan.Marker == "" {
		_, _ = fmt.Fprintf(out, "runwarden: the job's plan %s has no marker\n", file)
		return 2
	}
	r := &Runner{Plan: &plan, Out: out}
	result, err := r.Run(ctx)
	if err != nil {
		r.say(err.Error())
		return 1
	}
	if result != Success {
		return 1
	}
	return 0
}

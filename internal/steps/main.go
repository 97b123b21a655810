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
// 0 only when the job succeeded, 2 when the plan cannot be read.
func RunFile(ctx context.Context, file string, out io.Writer) int {
	b, err := os.ReadFile(file)
	if err != nil {
		_, _ = fmt.Fprintf(out, "runwarden: the job's plan: %v\n", err)
		return 2
	}
	return RunPlan(ctx, b, os.Environ(), out)
}

// RunPlan runs the plan in data (JSON) with environ as the environment
// every step starts from, and returns the process's exit code as RunFile.
func RunPlan(ctx context.Context, data []byte, environ []string, out io.Writer) int {
	var plan Plan
	if err := json.Unmarshal(data, &plan); err != nil {
		_, _ = fmt.Fprintf(out, "runwarden: the job's plan: %v\n", err)
		return 2
	}
	if plan.Marker == "" {
		_, _ = fmt.Fprintln(out, "runwarden: the job's plan has no marker")
		return 2
	}
	r := &Runner{Plan: &plan, Out: out, Environ: environ}
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

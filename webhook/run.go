package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/runwarden/runwarden/internal/version"
)

const usage = `Usage:
  runwarden-webhook [serve] [flags]     run the admission webhook (see serve --help)
  runwarden-webhook policy eval [flags] admit a pod file with the webhook's own code (see policy eval --help):
                                        the decision and the pod as admitted, what no file gave NOT CHECKED
  runwarden-webhook policy audit --policies DIR (--against-cluster [--namespaces NS,...] | --pods DIR) [flags]
                                        what a candidate policy set would do to the recent runner pods,
                                        against the set in force (see policy audit --help); exit 3 on new denials
  runwarden-webhook policy test [--min-coverage N] [--timeout D] [--total-timeout D] [DIR]
                                        run the policies' tests with coverage (default: the shipped policies)
  runwarden-webhook policy capabilities print the OPA capabilities the policies are compiled with
                                        (for opa check --capabilities)
  runwarden-webhook resolve [--out FILE] [--delivery envFile|files] [--termination-log FILE]
                                        resolve a runner's secret references into an env file
                                        (the runner pod's init container; see docs/secrets.md)
  runwarden-webhook --version
`

// run dispatches to the subcommand; every subcommand parses its own flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return serve(ctx, nil, stdout, stderr)
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "policy":
		if len(args) < 2 {
			fmt.Fprint(stderr, usage)
			return 2
		}
		switch {
		case isHelp(args[1]):
			fmt.Fprint(stdout, usage)
			return 0
		case args[1] == "eval":
			return policyEval(ctx, args[2:], stdout, stderr)
		case args[1] == "audit":
			return policyAudit(ctx, args[2:], stdout, stderr)
		case args[1] == "test":
			return policyTest(ctx, args[2:], stdout, stderr)
		case args[1] == "capabilities":
			return policyCapabilities(args[2:], stdout, stderr)
		}
		fmt.Fprintf(stderr, "runwarden-webhook: unknown policy command %q\n%s", args[1], usage)
		return 2
	case "resolve":
		return resolveSecrets(ctx, args[1:], stdout, stderr, os.Getenv)
	case "--version", "-version", "version":
		fmt.Fprintf(stdout, "runwarden-webhook %s\n", version.String())
		return 0
	}
	if isHelp(args[0]) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if args[0] != "" && args[0][0] == '-' {
		return serve(ctx, args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "runwarden-webhook: unknown command %q\n%s", args[0], usage)
	return 2
}

// splitList splits a comma-separated flag value, leaving out blanks.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// isHelp reports whether arg asks for the usage.
func isHelp(arg string) bool {
	switch arg {
	case "--help", "-help", "-h", "help":
		return true
	}
	return false
}

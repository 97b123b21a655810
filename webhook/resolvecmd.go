package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/runwarden/runwarden/internal/resolve"
)

// maxTerminationMessage is what the kubelet keeps of a termination message.
const maxTerminationMessage = 4096

// resolveSecrets is the runner pod's init container: it fetches the secret
// references the webhook planned (resolve.SpecEnv) from their stores and
// writes the env file the runner's variables are read from. On failure it
// writes the reason (the variable and the reference, never a value) to the
// termination message, which the dispatcher reports as
// SecretResolutionFailed, and exits 1.
func resolveSecrets(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	fs := flag.NewFlagSet("runwarden-webhook resolve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", filepath.Join(resolve.MountPath, resolve.EnvFile), "env file to write")
	termLog := fs.String("termination-log", "/dev/termination-log", "file the failure reason is written to (the container's terminationMessagePath)")
	delivery := fs.String("delivery", resolve.DeliveryEnvFile, `"envFile": the values in the env file --out; "files": each value in a file of its own, named by its key, in --out's folder`)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *delivery != resolve.DeliveryEnvFile && *delivery != resolve.DeliveryFiles {
		fmt.Fprintf(stderr, "runwarden-webhook resolve: --delivery %q: use envFile or files\n", *delivery)
		return 2
	}
	fail := func(err error) int {
		// One line: a store's error may span several.
		msg := "runwarden: resolving secret references: " + strings.Join(strings.Fields(err.Error()), " ")
		if len(msg) > maxTerminationMessage {
			msg = msg[:maxTerminationMessage]
		}
		fmt.Fprintln(stderr, msg)
		if *termLog != "" {
			_ = os.WriteFile(*termLog, []byte(msg), 0o644)
		}
		return 1
	}
	var vars []resolve.Var
	spec, err := base64.StdEncoding.DecodeString(getenv(resolve.SpecEnv))
	if err == nil {
		err = json.Unmarshal(spec, &vars)
	}
	if err != nil {
		return fail(fmt.Errorf("reading %s: %w", resolve.SpecEnv, err))
	}
	stores := map[string]resolve.Store{}
	for _, v := range vars {
		for _, r := range v.Refs {
			if _, done := stores[r.Store]; done {
				continue
			}
			switch r.Store {
			case "vault":
				o := resolve.VaultOptionsFromEnv(getenv)
				if o.Address == "" {
					// Not configured: Resolve names the store and the variable.
					continue
				}
				s, err := resolve.NewVault(ctx, o)
				if err != nil {
					return fail(err)
				}
				stores["vault"] = s
			case "ssm":
				if getenv("AWS_REGION") == "" && getenv("AWS_DEFAULT_REGION") == "" {
					// Not configured: Resolve names the store and the variable.
					continue
				}
				s, err := resolve.NewAWS(ctx)
				if err != nil {
					return fail(err)
				}
				stores["ssm"] = s
			case "gcp":
				// Application Default Credentials: the key file the
				// policies mount, or GKE's metadata server.
				s, err := resolve.NewGCP(ctx, getenv("GOOGLE_CLOUD_PROJECT"))
				if err != nil {
					return fail(err)
				}
				stores["gcp"] = s
			case "azure":
				// The service principal's or Workload Identity's variables;
				// without them the default credential would ask the
				// instance metadata service.
				if getenv("AZURE_CLIENT_ID") == "" {
					continue
				}
				s, err := resolve.NewAzure()
				if err != nil {
					return fail(err)
				}
				stores["azure"] = s
			default:
				stores[r.Store] = unsupported(r.Store)
			}
		}
	}
	values, err := resolve.Resolve(ctx, vars, stores, resolve.Options{})
	if err != nil {
		return fail(err)
	}
	switch *delivery {
	case resolve.DeliveryFiles:
		if err := resolve.WriteFiles(filepath.Dir(*out), values); err != nil {
			return fail(err)
		}
	default:
		if err := resolve.WriteEnvFile(*out, values, vars); err != nil {
			return fail(err)
		}
	}
	fmt.Fprintf(stdout, "runwarden: resolved %d variables\n", len(vars))
	return 0
}

// unsupported is a store this resolver does not read yet.
type unsupported string

func (u unsupported) Fetch(context.Context, resolve.Ref) (string, error) {
	return "", fmt.Errorf("resolving %s references is not supported", string(u))
}

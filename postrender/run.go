package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/runwarden/runwarden/internal/version"
	"github.com/runwarden/runwarden/postrender/render"
)

// Environment variables the command reads.
const (
	// EnvKustomize is the default of --kustomize.
	EnvKustomize = "RUNWARDEN_KUSTOMIZE"
	// envHelmPluginName and envHelmPluginDir are set by Helm when it runs
	// a plugin (see asHelmPlugin).
	envHelmPluginName = "HELM_PLUGIN_NAME"
	envHelmPluginDir  = "HELM_PLUGIN_DIR"
	// pluginName is the name in postrender/plugin/plugin.yaml.
	pluginName = "runwarden-postrender"
)

// Error formats for --error-format.
const (
	errorText           = "text"
	errorFormatManifest = "manifest"
	errorAuto           = "auto"
)

// config is the parsed command line.
type config struct {
	overlay      string
	resourceName string
	hooks        string
	errorFormat  string
	shardSize    int
	verbose      bool
	version      bool
}

const usage = `Usage: runwarden-postrender [flags]

A Helm post-renderer: reads Helm's rendered manifests on standard input, applies
the Kustomize overlay in --kustomize to them, and writes the result on standard
output. The overlay's kustomization lists the manifests as a resource named
all.yaml (--resource-name), as for "cat > all.yaml; kustomize build".

  helm install NAME CHART --post-renderer runwarden-postrender \
      --post-renderer-args --kustomize --post-renderer-args ./overlay

The same command line serves Helm v3 (--post-renderer names this binary, by path
or on PATH) and Helm v4 (it names the runwarden-postrender plugin: make
helm-plugin). Helm passes each --post-renderer-args on as one argument, -h and
--help too: help with manifests on standard input (a pipe or a file) fails
instead of rendering nothing.

Flags:
`

// errHelpWhileRendering: -h or --help with manifests on standard input, as
// when Helm passes them on in --post-renderer-args. Exiting 0 with nothing
// on standard output would install an empty release.
var errHelpWhileRendering = errors.New("help (-h or --help) asked for while standard input is a pipe or a file, as when Helm runs the post-renderer: nothing is rendered; take -h/--help out of --post-renderer-args, or run runwarden-postrender --help in a terminal")

// parse reads the command line into a config. The usage goes to help: on
// flag.ErrHelp the caller decides where it belongs.
func parse(args []string, getenv func(string) string, stderr, help io.Writer) (config, error) {
	c := config{}
	fs := flag.NewFlagSet("runwarden-postrender", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fs.SetOutput(help)
		fmt.Fprint(help, usage)
		fs.PrintDefaults()
		fs.SetOutput(stderr)
	}
	fs.StringVar(&c.overlay, "kustomize", getenv(EnvKustomize), "overlay `folder` holding a kustomization (default $"+EnvKustomize+")")
	fs.StringVar(&c.resourceName, "resource-name", "all.yaml", "file `name` under which the overlay sees Helm's manifests")
	fs.StringVar(&c.hooks, "hooks", string(render.HooksKustomize), "Helm hooks: \"kustomize\" applies the overlay to them, \"passthrough\" returns them untouched")
	fs.StringVar(&c.errorFormat, "error-format", errorAuto, "how errors reach the user: \"text\" (standard error, exit 1; 2 for a bad command line), \"manifest\" (a manifest Helm refuses, naming the error; for Helm v4 plugins, whose standard error Helm drops), \"auto\" (manifest when run as the runwarden-postrender Helm plugin)")
	fs.IntVar(&c.shardSize, "shard-size", 64, "documents per group when the input is split for speed; 0 never splits")
	fs.BoolVar(&c.verbose, "v", false, "print how the input was processed on standard error")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q: pass the overlay with --kustomize", fs.Args())
	}
	if c.version {
		return c, nil
	}
	if c.overlay == "" {
		return c, fmt.Errorf("no overlay: pass --kustomize DIR or set %s", EnvKustomize)
	}
	switch render.HookMode(c.hooks) {
	case render.HooksKustomize, render.HooksPassthrough:
	default:
		return c, fmt.Errorf("--hooks %q: use %q or %q", c.hooks, render.HooksKustomize, render.HooksPassthrough)
	}
	switch c.errorFormat {
	case errorText, errorFormatManifest:
	case errorAuto:
		c.errorFormat = errorText
		if asHelmPlugin(getenv) {
			c.errorFormat = errorFormatManifest
		}
	default:
		return c, fmt.Errorf("--error-format %q: use %q, %q or %q", c.errorFormat, errorText, errorFormatManifest, errorAuto)
	}
	if c.shardSize < 0 {
		return c, fmt.Errorf("--shard-size %d: must be 0 or more", c.shardSize)
	}
	return c, nil
}

// asHelmPlugin reports whether this process is Helm v4 running the
// runwarden-postrender plugin: the plugin named so, or this binary inside
// the plugin folder Helm names. Helm v3 sets the same variables for every
// plugin command, and a plugin (helm-secrets, helm-diff) that runs `helm
// template --post-renderer runwarden-postrender` passes its own on: there
// the errors must go to standard error with a failing exit code.
func asHelmPlugin(getenv func(string) string) bool {
	if getenv(envHelmPluginName) == pluginName {
		return true
	}
	dir := getenv(envHelmPluginDir)
	if dir == "" {
		return false
	}
	exe, err := os.Executable()
	if err != nil {
		return false
	}
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	if e, err := filepath.EvalSymlinks(exe); err == nil {
		exe = e
	}
	return strings.HasPrefix(exe, filepath.Clean(dir)+string(filepath.Separator))
}

// interactive reports whether standard input is a character device (a
// terminal, or /dev/null): no one is sending manifests. Helm sends them
// through a pipe.
func interactive(stdin io.Reader) bool {
	f, ok := stdin.(interface{ Stat() (os.FileInfo, error) })
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	var help bytes.Buffer
	c, err := parse(args, getenv, stderr, &help)
	if errors.Is(err, flag.ErrHelp) {
		if interactive(stdin) {
			_, _ = help.WriteTo(stdout)
			return 0
		}
		err = errHelpWhileRendering
	}
	_, _ = help.WriteTo(stderr) // the usage after a bad command line
	if err != nil {
		if asHelmPlugin(getenv) && c.errorFormat != errorText {
			// A Helm v4 plugin's standard error is dropped: a missing
			// RUNWARDEN_KUSTOMIZE must still reach the user.
			c.errorFormat = errorFormatManifest
			return fail(c, stdout, stderr, err)
		}
		fmt.Fprintf(stderr, "runwarden-postrender: %v\n", err)
		return 2
	}
	if c.version {
		fmt.Fprintf(stdout, "runwarden-postrender %s\n", version.String())
		return 0
	}
	render.WarmSchema(c.overlay)
	input, err := readInput(stdin, maxInputBytes)
	if err != nil {
		return fail(c, stdout, stderr, err)
	}
	prepareHeap(heapFor(len(input)))
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memoryLimitFor(len(input)))
	}
	shard := c.shardSize
	if shard == 0 {
		shard = -1
	}
	out, st, err := render.Render(ctx, render.Options{
		Overlay:      c.overlay,
		ResourceName: c.resourceName,
		Hooks:        render.HookMode(c.hooks),
		ShardSize:    shard,
	}, input)
	if err == nil && ctx.Err() != nil {
		// Interrupted during a build that does not stop midway: no output.
		err = fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	if err != nil {
		return fail(c, stdout, stderr, cliHint(c, err))
	}
	if c.verbose {
		fmt.Fprintf(stderr, "runwarden-postrender: %d documents, %d hooks passed through, %d shards", st.Documents, st.Hooks, st.Shards)
		if st.NotShardable != "" {
			fmt.Fprintf(stderr, ", built once because the overlay uses %s", st.NotShardable)
		}
		if st.Fallback != "" {
			fmt.Fprintf(stderr, ", built once because %s", st.Fallback)
		}
		fmt.Fprintln(stderr)
	}
	w := bufio.NewWriter(stdout)
	if _, err := w.Write(out); err != nil {
		fmt.Fprintf(stderr, "runwarden-postrender: writing standard output: %v\n", err)
		return 1
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintf(stderr, "runwarden-postrender: writing standard output: %v\n", err)
		return 1
	}
	return 0
}

// cliHint adds to a render error the flag that changes what went wrong.
func cliHint(c config, err error) error {
	var conflict *render.HookConflictError
	switch {
	case errors.Is(err, render.ErrNotListed):
		return fmt.Errorf("%w, or pass the name it lists for Helm's manifests with --resource-name", err)
	case errors.As(err, &conflict):
		return fmt.Errorf("%w: pass --hooks passthrough to return hooks untouched, outside the overlay", err)
	case errors.Is(err, render.ErrOverlayIsFile):
		return fmt.Errorf("%w: pass the folder that holds the kustomization, --kustomize %s", err, filepath.Dir(c.overlay))
	}
	return err
}

// maxInputBytes bounds the manifests read from standard input: a release
// far larger than any Helm stores (a release Secret holds 1 MiB,
// compressed), and far less than would exhaust a machine.
const maxInputBytes = 512 << 20

// readInput reads all of r, failing past limit bytes.
func readInput(r io.Reader, limit int) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("reading standard input: %w", err)
	}
	if len(b) > limit {
		return nil, fmt.Errorf("the manifests on standard input are larger than %d bytes, the most runwarden-postrender takes", limit)
	}
	return b, nil
}

// heapFor is the memory prepareHeap readies for an input of n bytes: about
// what Kustomize's heap grows to (700 bytes for each byte of input, 16 MiB at
// least for the schema and the build's setup), at most 64 MiB.
func heapFor(n int) int {
	return min(max(n*700, 16<<20), 64<<20)
}

// memoryLimitFor is the soft memory limit the process sets itself for an
// input of n bytes when GOMEMLIMIT is unset: 64 bytes for each byte of input,
// 64 MiB at least. With GOGC=400 the heap would otherwise grow to five times
// what stays in use, which is 20 to 40 bytes for each byte of input (a split
// render or a single build): at 2,000 documents the process then took more
// memory than `kustomize build`. Under the limit the collector runs earlier
// instead; the limit is soft, so a render that needs more only collects
// more often.
func memoryLimitFor(n int) int64 {
	return int64(max(n*64, 64<<20))
}

// fail reports err. In manifest format it also writes, on standard output, a
// manifest that Helm refuses with an error naming the cause, and exits 0:
// Helm v4 discards a post-renderer plugin's standard error and says only that
// it "exited with error", but it quotes the file name annotation of a
// manifest it cannot read.
func fail(c config, stdout, stderr io.Writer, err error) int {
	msg := "runwarden-postrender: " + err.Error()
	fmt.Fprintln(stderr, msg)
	if c.errorFormat != errorFormatManifest {
		return 1
	}
	if tty, terr := os.OpenFile("/dev/tty", os.O_WRONLY, 0); terr == nil {
		fmt.Fprintln(tty, msg)
		_ = tty.Close()
	}
	fmt.Fprint(stdout, errorManifest(msg))
	return 0
}

// errorManifest is a YAML document Helm parses, whose kind is not a string:
// Helm v4 then fails with "YAML parse error on <file name>", and the file
// name annotation carries the message.
func errorManifest(msg string) string {
	oneLine := strings.Join(strings.Fields(msg), " ")
	quoted := strings.ReplaceAll(oneLine, `'`, `''`)
	return "apiVersion: v1\n" +
		"kind:\n  runwarden-postrender: failed, see metadata\n" +
		"metadata:\n  name: runwarden-postrender-error\n  annotations:\n" +
		"    postrenderer.helm.sh/postrender-filename: '" + quoted + "'\n"
}

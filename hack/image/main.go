// Command image builds a container image archive from static binaries, with
// no container engine and no registry. The archive is in the format of
// `docker save`, so `ctr images import`, `kind load image-archive` and
// `docker load` all take it.
//
//	go run ./hack/image --ref localhost/runwarden/runner:v1 --out runner.tar \
//	    --busybox /bin/busybox --file /path/to/tofu=/usr/local/bin/tofu
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is what the command line asks for.
type config struct {
	ref, out string
	spec     Spec
}

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func parse(args []string, stderr io.Writer) (config, error) {
	var c config
	var files, env, labels listFlag
	var entrypoint, cmd string
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.ref, "ref", "", "image reference to record in the archive, e.g. localhost/runwarden/runner:v1 (required)")
	fs.StringVar(&c.out, "out", "", "archive file to write (required)")
	fs.Var(&files, "file", "SRC=DST[:MODE]: copy host file SRC to DST in the image, MODE in octal (repeatable)")
	fs.StringVar(&c.spec.Busybox, "busybox", "", "static busybox binary to install with all its applets, giving the image a shell")
	fs.StringVar(&c.spec.AppletsFrom, "applets-from", "", "busybox binary of the same version run to list the applets (default: --busybox; set it when --busybox is for another architecture)")
	fs.StringVar(&c.spec.Arch, "arch", "amd64", "the image's architecture (GOARCH), e.g. arm64; the files must be built for it")
	fs.IntVar(&c.spec.UID, "uid", 65532, "user ID the image runs as")
	fs.StringVar(&c.spec.User, "user", "runner", "name of that user in /etc/passwd")
	fs.StringVar(&entrypoint, "entrypoint", "", "entrypoint, comma-separated")
	fs.StringVar(&cmd, "cmd", "", "command, comma-separated")
	fs.StringVar(&c.spec.WorkingDir, "workdir", "", "working directory")
	fs.Var(&env, "env", "K=V environment variable (repeatable)")
	fs.Var(&labels, "label", "K=V image label (repeatable)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.ref == "" || c.out == "" {
		return c, errors.New("--ref and --out are required")
	}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok || src == "" || dst == "" {
			return c, fmt.Errorf("--file %q: want SRC=DST[:MODE]", f)
		}
		file := File{Src: src, Dst: dst}
		if d, m, ok := strings.Cut(dst, ":"); ok {
			mode, err := strconv.ParseInt(m, 8, 64)
			if err != nil {
				return c, fmt.Errorf("--file %q: mode %q is not octal: %w", f, m, err)
			}
			file.Dst, file.Mode = d, mode
		}
		c.spec.Files = append(c.spec.Files, file)
	}
	if entrypoint != "" {
		c.spec.Entrypoint = strings.Split(entrypoint, ",")
	}
	if cmd != "" {
		c.spec.Cmd = strings.Split(cmd, ",")
	}
	c.spec.Env = env
	c.spec.Labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return c, fmt.Errorf("--label %q: want K=V", l)
		}
		c.spec.Labels[k] = v
	}
	return c, nil
}

func run(_ context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "image:", err)
		return 2
	}
	ref, err := name.ParseReference(c.ref)
	if err != nil {
		fmt.Fprintf(stderr, "image: --ref %q: %v\n", c.ref, err)
		return 2
	}
	img, err := Build(c.spec)
	if err != nil {
		fmt.Fprintln(stderr, "image:", err)
		return 1
	}
	tmp := c.out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		fmt.Fprintf(stderr, "image: writing %s: %v\n", c.out, err)
		return 1
	}
	if err := os.Rename(tmp, c.out); err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 1
	}
	digest, err := img.Digest()
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s %s %s\n", c.ref, digest, c.out)
	return 0
}

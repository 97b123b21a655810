//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// binaries are the suite's programs, each built once in a run and shared
// by every test that starts it: the suite starts dozens of dispatchers and
// webhooks, side by side, and each `go build` of one links some 80 MB, for
// about 5 s of a core even with every package in the build cache. A binary
// is only ever run, never changed, so sharing it is safe.
type binaries struct {
	dir   string
	mu    sync.Mutex
	built map[string]*binary
}

// binary is one build: the first caller builds, the others wait for it.
type binary struct {
	once sync.Once
	path string
	err  error
}

// newBinaries makes the folder the run's binaries go to; remove removes it.
func newBinaries() (*binaries, error) {
	dir, err := os.MkdirTemp("", "runwarden-e2e-bin-")
	if err != nil {
		return nil, fmt.Errorf("making a folder for the suite's binaries: %w", err)
	}
	return &binaries{dir: dir, built: map[string]*binary{}}, nil
}

func (b *binaries) remove() error { return os.RemoveAll(b.dir) }

// build returns the binary of the main package pkg ("./dispatcher") of the
// module in src (suite.RepoRoot, or another checkout), built with env added
// to the environment. A failed build fails the test.
func (b *binaries) build(ctx context.Context, t testing.TB, src, pkg string, env ...string) string {
	t.Helper()
	key := strings.Join(append([]string{src, pkg}, env...), "\x00")
	b.mu.Lock()
	bin, ok := b.built[key]
	if !ok {
		bin = &binary{path: filepath.Join(b.dir, fmt.Sprintf("%d-%s", len(b.built), filepath.Base(pkg)))}
		b.built[key] = bin
	}
	b.mu.Unlock()
	bin.once.Do(func() {
		// Not the first caller's context: its test may end while another
		// waits on the build.
		cmd := exec.CommandContext(context.WithoutCancel(ctx), "go", "build", "-o", bin.path, pkg)
		cmd.Dir = src
		cmd.Env = append(slices.Clone(os.Environ()), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			bin.err = fmt.Errorf("go build %s in %s: %w\n%s", pkg, src, err, out)
		}
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

package render

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/kio"
)

// BenchmarkPostrender times, side by side, for inputs of growing size and
// the benchmark overlay (labels, a namespace, an image rewrite, three
// patches):
//   - impl=runwarden-postrender: the built binary, as Helm runs it (a whole
//     process: start, read, render, write);
//   - impl=kustomize-cli: the script users run instead,
//     `cat > all.yaml; kustomize build .` with the pinned kustomize CLI;
//   - impl=yaml-floor: a plain YAML decode and re-encode of the same stream
//     in process, the least any post-renderer must do.
//
// The CLI takes minutes above 5,000 documents; it runs up to
// RUNWARDEN_BENCH_CLI_MAX_DOCS documents (default 5000) and says so when it
// skips.
func BenchmarkPostrender(b *testing.B) {
	overlay, err := filepath.Abs("testdata/bench-overlay")
	if err != nil {
		b.Fatal(err)
	}
	bin := buildPostrender(b)
	cli := kustomizeCLI(b)
	cliMax := 5000
	if v := os.Getenv("RUNWARDEN_BENCH_CLI_MAX_DOCS"); v != "" {
		if cliMax, err = strconv.Atoi(v); err != nil {
			b.Fatalf("RUNWARDEN_BENCH_CLI_MAX_DOCS=%q: %v", v, err)
		}
	}
	for _, n := range []int{200, 2000, 5000, 10000} {
		input := genManifests(n)
		b.Run(fmt.Sprintf("docs=%d/impl=runwarden-postrender", n), func(b *testing.B) {
			for b.Loop() {
				cmd := exec.Command(bin, "--kustomize", overlay)
				cmd.Stdin = bytes.NewReader(input)
				if out, err := cmd.Output(); err != nil || len(out) == 0 {
					b.Fatalf("runwarden-postrender: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("docs=%d/impl=kustomize-cli", n), func(b *testing.B) {
			if n > cliMax {
				b.Skipf("skipped: the kustomize CLI runs up to %d documents (RUNWARDEN_BENCH_CLI_MAX_DOCS)", cliMax)
			}
			dir := b.TempDir()
			if err := os.CopyFS(dir, os.DirFS(overlay)); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				cmd := exec.Command("/bin/sh", "-c", `cat > all.yaml && "$0" build . && rm all.yaml`, cli)
				cmd.Dir = dir
				cmd.Stdin = bytes.NewReader(input)
				if out, err := cmd.Output(); err != nil || len(out) == 0 {
					b.Fatalf("kustomize build: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("docs=%d/impl=yaml-floor", n), func(b *testing.B) {
			for b.Loop() {
				nodes, err := (&kio.ByteReader{Reader: bytes.NewReader(input), OmitReaderAnnotations: true}).Read()
				if err != nil {
					b.Fatal(err)
				}
				var out bytes.Buffer
				if err := (kio.ByteWriter{Writer: &out}).Write(nodes); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// buildPostrender builds the runwarden-postrender binary for the benchmark.
func buildPostrender(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "runwarden-postrender")
	cmd := exec.Command("go", "build", "-o", bin, "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

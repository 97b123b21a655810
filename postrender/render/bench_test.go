package render

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"testing"
	"time"

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
// The two commands also report peak-MiB, the largest resident set of any of
// their runs (for the script, of its largest process: the CLI).
//
// The CLI takes minutes above 5,000 documents; it runs up to
// RUNWARDEN_BENCH_CLI_MAX_DOCS documents (default 5000) and says so when it
// skips.
func BenchmarkPostrender(b *testing.B) {
	benchPostrender(b, "testdata/bench-overlay", []int{200, 2000, 5000, 10000})
}

// BenchmarkPostrenderReplacements is BenchmarkPostrender with the benchmark
// overlay and replacements that copy values of the overlay's own ConfigMap
// and of two of Helm's documents into every Deployment and Service: the
// result for one document depends on others.
func BenchmarkPostrenderReplacements(b *testing.B) {
	benchPostrender(b, "testdata/bench-replacements", []int{200, 2000})
}

// BenchmarkPostrenderLabels is BenchmarkPostrender at 200 documents with the
// shipped labels overlay (labels and annotations), which needs no OpenAPI
// schema: the process start and the library's fixed costs weigh most there.
func BenchmarkPostrenderLabels(b *testing.B) {
	benchPostrender(b, "../../kustomize/labels", []int{200})
}

func benchPostrender(b *testing.B, overlayDir string, sizes []int) {
	overlay, err := filepath.Abs(overlayDir)
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
	// postrender and script run one command on input and return its peak
	// resident set; the script works in its own copy of the overlay.
	postrender := func(b *testing.B, input []byte) int64 {
		resetPeak(b)
		cmd := exec.Command(bin, "--kustomize", overlay)
		cmd.Stdin = bytes.NewReader(input)
		if out, err := cmd.Output(); err != nil || len(out) == 0 {
			b.Fatalf("runwarden-postrender: %v", err)
		}
		return maxRSS(cmd)
	}
	dir := b.TempDir()
	if err := os.CopyFS(dir, os.DirFS(overlay)); err != nil {
		b.Fatal(err)
	}
	script := func(b *testing.B, input []byte) int64 {
		resetPeak(b)
		cmd := exec.Command("/bin/sh", "-c", `cat > all.yaml && "$0" build . && rm all.yaml`, cli)
		cmd.Dir = dir
		cmd.Stdin = bytes.NewReader(input)
		if out, err := cmd.Output(); err != nil || len(out) == 0 {
			b.Fatalf("kustomize build: %v", err)
		}
		return maxRSS(cmd)
	}
	// One untimed run of each command first, on the smallest input: runs
	// right after the binary was built were the slowest (148-175 ms at 200
	// documents, against 82-95 ms later), and a user's Helm runs the
	// post-renderer many times.
	warm := genManifests(200)
	postrender(b, warm)
	script(b, warm)
	for _, n := range sizes {
		input := genManifests(n)
		b.Run(fmt.Sprintf("docs=%d/impl=runwarden-postrender", n), func(b *testing.B) {
			var peak int64
			for b.Loop() {
				peak = max(peak, postrender(b, input))
			}
			reportPeak(b, peak)
		})
		b.Run(fmt.Sprintf("docs=%d/impl=kustomize-cli", n), func(b *testing.B) {
			if n > cliMax {
				b.Skipf("skipped: the kustomize CLI runs up to %d documents (RUNWARDEN_BENCH_CLI_MAX_DOCS)", cliMax)
			}
			var peak int64
			for b.Loop() {
				peak = max(peak, script(b, input))
			}
			reportPeak(b, peak)
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

// resetPeak, outside the timed part of a benchmark, makes the next command's
// peak resident set its own. os/exec starts a command in this process's
// memory (vfork), and Linux counts the peak of that memory into the
// command's when it executes: a command started after the YAML floor of
// 2,000 documents ran in this process reported 147 MiB, whatever it used.
// The memory this process does not use is returned to the system, and its
// peak reset to what it then holds (/proc/self/clear_refs, "5").
func resetPeak(b *testing.B) {
	b.StopTimer()
	defer b.StartTimer()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("peak-MiB may count this process's memory: %v", err)
	}
}

// maxRSS is the largest resident set, in KiB, of a finished command and of
// the processes it waited for (Linux reports the largest of them all).
func maxRSS(cmd *exec.Cmd) int64 {
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		return int64(ru.Maxrss)
	}
	return 0
}

// reportPeak reports the largest resident set of the runs, in MiB, when the
// system told it.
func reportPeak(b *testing.B, kib int64) {
	if kib > 0 {
		b.ReportMetric(float64(kib)/1024, "peak-MiB")
	}
}

// buildPostrender builds the runwarden-postrender binary.
func buildPostrender(b testing.TB) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "runwarden-postrender")
	cmd := exec.Command("go", "build", "-o", bin, "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// BenchmarkRenderInProcess times Render alone at 200 documents with the
// benchmark overlay, in a warm process: the built-in OpenAPI schema already
// decoded, no process start, no reading or writing. It reports the CPU time
// per render beside the wall time: on a machine with P cores no process
// that runs the same library work can finish faster than cpu-ms/op ÷ P.
func BenchmarkRenderInProcess(b *testing.B) {
	overlay := filepath.Join("testdata", "bench-overlay")
	input := genManifests(200)
	if _, _, err := Render(b.Context(), Options{Overlay: overlay}, input); err != nil {
		b.Fatal(err) // also decodes the schema before the clock starts
	}
	for _, size := range []int{-1, 64} {
		name := "split"
		if size < 0 {
			name = "single-build"
		}
		b.Run("docs=200/"+name, func(b *testing.B) {
			start := cpuTime(b)
			for b.Loop() {
				if _, _, err := Render(b.Context(), Options{Overlay: overlay, ShardSize: size}, input); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

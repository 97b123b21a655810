package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/runwarden/runwarden/internal/helpdoc"
)

const overlay = "../kustomize/labels"

const manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"

// hookManifest is manifest as a Helm hook.
const hookManifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  annotations:\n    helm.sh/hook: pre-install\n"

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		stdin      string
		tty        bool // standard input is a terminal
		wantCode   int
		wantStdout []string
		wantStderr []string
		notStdout  []string
		notStderr  []string
	}{
		{name: "renders", args: []string{"--kustomize", overlay}, stdin: manifest, wantStdout: []string{"platform.example.com/team: platform", "name: a"}},
		{name: "overlay from the environment", env: map[string]string{EnvKustomize: overlay}, stdin: manifest, wantStdout: []string{"platform.example.com/team: platform"}},
		{name: "version", args: []string{"--version"}, wantStdout: []string{"runwarden-postrender "}},
		{name: "help", args: []string{"--help"}, tty: true, wantStdout: []string{"Usage: runwarden-postrender", "-kustomize"}},
		{name: "-h", args: []string{"-h"}, tty: true, wantStdout: []string{"Usage: runwarden-postrender"}},
		{
			// Helm v3 passes --post-renderer-args on as they are: a help
			// that exits 0 with nothing on standard output is an empty release.
			name: "help with manifests on standard input fails", args: []string{"--kustomize", overlay, "--help"}, stdin: manifest, wantCode: 2,
			wantStderr: []string{"Usage: runwarden-postrender", "-kustomize", "help (-h or --help) asked for while standard input is a pipe or a file"},
			notStdout:  []string{"Usage"},
		},
		{
			name: "-h from an empty pipe fails", args: []string{"-h"}, wantCode: 2,
			wantStderr: []string{"help (-h or --help) asked for"},
		},
		{
			name: "as a Helm plugin help becomes a manifest Helm refuses", args: []string{"--kustomize", overlay, "-h"}, stdin: manifest,
			env:        map[string]string{envHelmPluginName: "runwarden-postrender"},
			wantStdout: []string{"postrenderer.helm.sh/postrender-filename: 'runwarden-postrender: help (-h or --help) asked for"},
		},
		{
			name: "an overlay that is a file", args: []string{"--kustomize", overlay + "/kustomization.yaml"}, stdin: manifest, wantCode: 1,
			wantStderr: []string{overlay + "/kustomization.yaml is a file, not a folder", "--kustomize " + overlay},
		},
		{
			name: "a resource name the overlay does not list names the flag", args: []string{"--kustomize", overlay, "--resource-name", "helm.yaml"}, stdin: manifest,
			wantCode: 1, wantStderr: []string{`add "helm.yaml" to resources`, "--resource-name"},
		},
		{
			// Helm v4 sends hooks too; a chart may declare one resource as both.
			name: "a hook that is also a template points to --hooks passthrough", args: []string{"--kustomize", overlay}, stdin: manifest + "---\n" + hookManifest,
			wantCode: 1, wantStderr: []string{"already registered id", "ConfigMap a is both a Helm hook and a template", "--hooks passthrough"},
		},
		{
			name: "a hook that is also a template passes through", args: []string{"--kustomize", overlay, "--hooks", "passthrough"}, stdin: manifest + "---\n" + hookManifest,
			wantStdout: []string{"platform.example.com/team: platform", "helm.sh/hook: pre-install"},
		},
		{
			name: "two templates of one resource get no hook hint", args: []string{"--kustomize", overlay}, stdin: manifest + "---\n" + manifest,
			wantCode: 1, wantStderr: []string{"already registered id"}, notStderr: []string{"--hooks"},
		},
		{name: "no overlay", stdin: manifest, wantCode: 2, wantStderr: []string{"no overlay", EnvKustomize}},
		{name: "bad hooks", args: []string{"--kustomize", overlay, "--hooks", "x"}, wantCode: 2, wantStderr: []string{"--hooks"}},
		{name: "stray argument", args: []string{"--kustomize", overlay, "extra"}, wantCode: 2, wantStderr: []string{"unexpected arguments"}},
		{name: "empty input fails", args: []string{"--kustomize", overlay}, wantCode: 1, wantStderr: []string{"no manifests on standard input"}},
		{name: "verbose", args: []string{"--kustomize", overlay, "-v"}, stdin: manifest, wantStderr: []string{"1 documents"}},
		{
			name: "as a Helm plugin an error becomes a manifest Helm refuses", args: []string{"--kustomize", overlay},
			env: map[string]string{envHelmPluginName: "runwarden-postrender"}, stdin: "",
			wantStdout: []string{"postrenderer.helm.sh/postrender-filename: 'runwarden-postrender: no manifests on standard input'"},
			wantStderr: []string{"no manifests"},
		},
		{
			name: "as a Helm plugin a missing overlay becomes a manifest Helm refuses",
			env:  map[string]string{envHelmPluginName: "runwarden-postrender"}, stdin: manifest,
			wantStdout: []string{"postrenderer.helm.sh/postrender-filename: 'runwarden-postrender: no overlay: pass --kustomize DIR or set " + EnvKustomize + "'"},
			wantStderr: []string{"no overlay"},
		},
		{
			name: "as the plugin found by its folder an error becomes a manifest", args: []string{"--kustomize", overlay},
			env: map[string]string{envHelmPluginName: "renamed", envHelmPluginDir: filepath.Dir(testBinary())}, stdin: "",
			wantStdout: []string{"postrenderer.helm.sh/postrender-filename: 'runwarden-postrender: no manifests on standard input'"},
		},
		{
			// helm-secrets and the like run `helm template --post-renderer`
			// with their own plugin variables set, under Helm v3.
			name: "under another Helm plugin errors fail the command", args: []string{"--kustomize", overlay},
			env: map[string]string{envHelmPluginName: "secrets", envHelmPluginDir: t.TempDir()}, wantCode: 1, wantStderr: []string{"no manifests"},
		},
		{
			name: "text errors even as a plugin when asked", args: []string{"--kustomize", overlay, "--error-format", "text"},
			env: map[string]string{envHelmPluginName: "x"}, wantCode: 1, wantStderr: []string{"no manifests"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			var stdin io.Reader = strings.NewReader(tt.stdin)
			if tt.tty {
				stdin = terminal{stdin}
			}
			code := run(t.Context(), tt.args, env(tt.env), stdin, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tt.wantCode, stderr.String())
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			for _, w := range tt.notStdout {
				if strings.Contains(stdout.String(), w) {
					t.Errorf("stdout holds %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tt.notStderr {
				if strings.Contains(stderr.String(), w) {
					t.Errorf("stderr holds %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// terminal is standard input as a terminal: a character device.
type terminal struct{ io.Reader }

func (terminal) Stat() (os.FileInfo, error) { return terminalInfo{}, nil }

// terminalInfo answers Mode only.
type terminalInfo struct{ os.FileInfo }

func (terminalInfo) Mode() os.FileMode { return os.ModeDevice | os.ModeCharDevice }

// TestErrorManifestIsValidYAMLWithAStringlessKind checks the shape Helm v4
// refuses with the message in its error: valid YAML (so Helm reads it), a
// kind that is not a string, the message in the file name annotation, even
// when the message has quotes and line breaks.
func TestErrorManifestIsValidYAMLWithAStringlessKind(t *testing.T) {
	t.Parallel()
	msg := "runwarden-postrender: document 2 (input line 6): yaml: line 3: it's\nbroken"
	n, err := yaml.Parse(errorManifest(msg))
	if err != nil {
		t.Fatalf("error manifest is not YAML: %v", err)
	}
	if k := n.Field("kind"); k == nil || k.Value.YNode().Kind != yaml.MappingNode {
		t.Errorf("kind must be a mapping, so Helm cannot read it")
	}
	got := n.GetAnnotations()["postrenderer.helm.sh/postrender-filename"]
	if want := "runwarden-postrender: document 2 (input line 6): yaml: line 3: it's broken"; got != want {
		t.Errorf("annotation = %q, want %q", got, want)
	}
}

// Every flag --help lists is in docs/postrender.md.
func TestDocsNameEveryFlag(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	run(t.Context(), []string{"--help"}, func(string) string { return "" }, strings.NewReader(""), &out, &errOut)
	help := out.String() + errOut.String()
	missing, err := helpdoc.Missing(help, "../docs/postrender.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(helpdoc.Flags(help)) < 5 || len(missing) > 0 {
		t.Errorf("docs/postrender.md lacks flags %v (help:\n%s)", missing, help)
	}
}

func testBinary() string {
	exe, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return exe
}

func TestCopyOnceDropsRepeatedLines(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	copyOnce(&out, strings.NewReader("# Warning: a\n# Warning: b\n# Warning: a\nlast"))
	if got, want := out.String(), "# Warning: a\n# Warning: b\nlast\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestReadInputIsBounded(t *testing.T) {
	t.Parallel()
	if b, err := readInput(strings.NewReader("0123456789"), 10); err != nil || string(b) != "0123456789" {
		t.Errorf("10 bytes with a limit of 10: %q, %v", b, err)
	}
	if _, err := readInput(strings.NewReader("0123456789x"), 10); err == nil || !strings.Contains(err.Error(), "larger than 10 bytes") {
		t.Errorf("11 bytes with a limit of 10: %v, want an error naming the limit", err)
	}
}

func TestMemoryLimitFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		input int
		want  int64
	}{
		{name: "200 documents get the floor", input: 69 << 10, want: 64 << 20},
		{name: "2,000 documents get the floor", input: 695 << 10, want: 64 << 20},
		{name: "10,000 documents", input: 3500 << 10, want: 3500 << 10 * 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := memoryLimitFor(tc.input); got != tc.want {
				t.Errorf("memoryLimitFor(%d) = %d, want %d", tc.input, got, tc.want)
			}
		})
	}
}

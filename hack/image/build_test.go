package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

func writeFile(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func digestOf(t *testing.T, s Spec) string {
	t.Helper()
	img, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// layerFiles reads the image's filesystem as path -> (mode, content or link).
func layerFiles(t *testing.T, s Spec) map[string]string {
	t.Helper()
	img, err := Build(s)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		v := string(b)
		if h.Typeflag == tar.TypeSymlink {
			v = "-> " + h.Linkname
		}
		got[h.Name] = v
		if h.Typeflag == tar.TypeReg && h.Mode != 0o644 {
			got[h.Name] += " mode=" + os.FileMode(h.Mode).String()
		}
	}
	return got
}

func TestBuildPutsFilesInPlace(t *testing.T) {
	t.Parallel()
	bin := writeFile(t, "tool", "#!binary", 0o755)
	got := layerFiles(t, Spec{Files: []File{{Src: bin, Dst: "/opt/x/tool"}, {Src: bin, Dst: "/etc/tool.conf", Mode: 0o600}}})
	want := map[string]string{
		"opt/x/tool":    "#!binary mode=-rwxr-xr-x",
		"etc/tool.conf": "#!binary mode=-rw-------",
		"etc/passwd":    "root:x:0:0:root:/root:/bin/sh\nrunner:x:65532:65532:runner:/home/runner:/bin/sh\n",
		"etc/group":     "root:x:0:\nrunner:x:65532:\n",
		"opt":           "",
		"opt/x":         "",
		"tmp":           "",
		"home/runner":   "",
		"bin":           "",
		"etc":           "",
		"home":          "",
		"usr":           "",
		"usr/bin":       "",
		"usr/local":     "",
		"usr/local/bin": "",
		"var":           "",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("image files mismatch (-want +got):\n%s", diff)
	}
}

func TestBuildIsReproducible(t *testing.T) {
	t.Parallel()
	bin := writeFile(t, "tool", "same bytes", 0o755)
	s := Spec{Files: []File{{Src: bin, Dst: "/tool"}}, Entrypoint: []string{"/tool"}, Labels: map[string]string{"a": "b"}}
	var digests []string
	for range 2 {
		digests = append(digests, digestOf(t, s))
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of the same spec differ: %v", digests)
	}
	// The same bytes built under another umask (go build writes its output
	// 0777 &^ umask): the image is the same. A release rebuilt by another
	// user or CI runner must give the digest that was signed.
	for _, mode := range []os.FileMode{0o700, 0o775, 0o777, 0o750} {
		other := writeFile(t, "tool", "same bytes", 0o600)
		if err := os.Chmod(other, mode); err != nil {
			t.Fatal(err)
		}
		o := s
		o.Files = []File{{Src: other, Dst: "/tool"}}
		if d := digestOf(t, o); d != digests[0] {
			t.Errorf("the same program with host mode %v: digest %s, with 0755 %s", mode, d, digests[0])
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o664, 0o640} {
		a, b := writeFile(t, "conf", "x", 0o600), writeFile(t, "conf", "x", 0o600)
		if err := os.Chmod(b, mode); err != nil {
			t.Fatal(err)
		}
		da := digestOf(t, Spec{Files: []File{{Src: a, Dst: "/etc/conf"}}})
		if db := digestOf(t, Spec{Files: []File{{Src: b, Dst: "/etc/conf"}}}); db != da {
			t.Errorf("the same file with host modes 0600 and %v: digests %s and %s", mode, da, db)
		}
	}
	img, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.OS != "linux" || cf.Config.Entrypoint[0] != "/tool" || cf.Config.Labels["a"] != "b" {
		t.Errorf("config = %+v", cf.Config)
	}
}

func TestBuildErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec Spec
	}{
		{name: "relative destination", spec: Spec{Files: []File{{Src: "/bin/sh", Dst: "bin/sh"}}}},
		{name: "missing source", spec: Spec{Files: []File{{Src: "/does/not/exist", Dst: "/x"}}}},
		{name: "missing busybox", spec: Spec{Busybox: "/does/not/exist"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Build(tt.spec); err == nil {
				t.Error("Build succeeded, want an error")
			}
		})
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		want    Spec
		wantErr bool
	}{
		{
			name: "files with and without mode",
			args: []string{"--ref", "r", "--out", "o", "--file", "/a=/b", "--file", "/c=/d:0600", "--entrypoint", "/b,x", "--label", "k=v"},
			want: Spec{
				Files:      []File{{Src: "/a", Dst: "/b"}, {Src: "/c", Dst: "/d", Mode: 0o600}},
				Arch:       "amd64",
				UID:        65532,
				User:       "runner",
				Entrypoint: []string{"/b", "x"},
				Labels:     map[string]string{"k": "v"},
			},
		},
		{name: "ref required", args: []string{"--out", "o"}, wantErr: true},
		{name: "bad file", args: []string{"--ref", "r", "--out", "o", "--file", "/a"}, wantErr: true},
		{name: "bad mode", args: []string{"--ref", "r", "--out", "o", "--file", "/a=/b:99x"}, wantErr: true},
		{name: "bad label", args: []string{"--ref", "r", "--out", "o", "--label", "k"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := parse(tt.args, io.Discard)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parse error = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if diff := cmp.Diff(tt.want, c.spec); diff != "" {
				t.Errorf("spec mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunWritesArchive(t *testing.T) {
	t.Parallel()
	bin := writeFile(t, "tool", "x", 0o755)
	out := filepath.Join(t.TempDir(), "img.tar")
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"--ref", "localhost/runwarden/test:v1", "--out", out, "--file", bin + "=/tool"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("archive not written: %v", err)
	}
	if code := run(t.Context(), []string{"--ref", "Not A Ref!", "--out", out}, &stdout, &stderr); code != 2 {
		t.Errorf("run with a bad ref exited %d, want 2", code)
	}
}

func TestBuildRefusesAProgramOfAnotherArchitecture(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary is built for this machine; an image of another
	// architecture must not take it.
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	_, err = Build(Spec{Arch: other, Files: []File{{Src: self, Dst: "/usr/local/bin/tool"}}})
	if err == nil || !strings.Contains(err.Error(), "not for the image's architecture "+other) {
		t.Fatalf("Build of a %s program into a %s image: err = %v, want a refusal naming the architecture", runtime.GOARCH, other, err)
	}
	img, err := Build(Spec{Arch: runtime.GOARCH, Files: []File{{Src: self, Dst: "/usr/local/bin/tool"}}})
	if err != nil {
		t.Fatalf("Build for this machine's architecture: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Architecture != runtime.GOARCH || cf.OS != "linux" {
		t.Errorf("config platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if _, err := Build(Spec{Arch: "mips", Files: []File{{Src: self, Dst: "/tool"}}}); err == nil {
		t.Error("Build with an unknown architecture and an ELF file: want an error")
	}
}

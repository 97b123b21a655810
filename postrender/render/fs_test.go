package render

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestOverlayFilesAreBounded: an overlay's patch files are read only when
// they are regular files, inside the kustomization's folder once symbolic
// links are resolved, and of a bounded size; a FIFO, a device or a file
// outside is refused without being read (none of these cases may hang or
// exhaust memory).
func TestOverlayFilesAreBounded(t *testing.T) {
	t.Parallel()
	outside := filepath.Join(t.TempDir(), "outside.yaml")
	if err := os.WriteFile(outside, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: {stolen: \"true\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the patch path
		field string                                // of the kustomization that names it; default patches
		is    error
		want  string
	}{
		{name: "a path to /dev/zero", setup: func(*testing.T, string) string { return "../../../../../../../../dev/zero" }, want: "dev/zero"},
		{name: "a symbolic link to /dev/zero", setup: func(t *testing.T, dir string) string {
			link(t, "/dev/zero", filepath.Join(dir, "zero.yaml"))
			return "zero.yaml"
		}, want: "zero.yaml"},
		{name: "a FIFO", setup: func(t *testing.T, dir string) string {
			if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
				t.Fatal(err)
			}
			return "fifo.yaml"
		}, is: ErrOverlayFile, want: "fifo.yaml is not a regular file"},
		{name: "a file past the size bound", setup: func(t *testing.T, dir string) string {
			f, err := os.Create(filepath.Join(dir, "huge.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = f.Close() }()
			if err := f.Truncate(MaxOverlayFileBytes + 1); err != nil { // sparse: no disk used
				t.Fatal(err)
			}
			return "huge.yaml"
		}, is: ErrOverlayFile, want: "huge.yaml has 67108865 bytes"},
		{name: "a symbolic link out of the folder", setup: func(t *testing.T, dir string) string {
			link(t, outside, filepath.Join(dir, "out.yaml"))
			return "out.yaml"
		}, want: "out.yaml"},
		{name: "a replacements file linked out of the folder", field: "replacements", setup: func(t *testing.T, dir string) string {
			link(t, outside, filepath.Join(dir, "out.yaml"))
			return "out.yaml"
		}, want: "out.yaml"},
		{name: "a FIFO of replacements", field: "replacements", setup: func(t *testing.T, dir string) string {
			if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
				t.Fatal(err)
			}
			return "fifo.yaml"
		}, is: ErrOverlayFile, want: "fifo.yaml is not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			patch := tt.setup(t, dir)
			field := tt.field
			if field == "" {
				field = "patches"
			}
			k := "resources: [all.yaml]\n" + field + ":\n- path: " + patch + "\n"
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
				t.Fatal(err)
			}
			out, _, err := Render(t.Context(), Options{Overlay: dir}, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"))
			if err == nil {
				t.Fatalf("Render succeeded:\n%s", out)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v, want errors.Is %v", err, tt.is)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %q", err, tt.want)
			}
		})
	}
}

func link(t *testing.T, target, name string) {
	t.Helper()
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

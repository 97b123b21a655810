package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one host file copied into the image.
type File struct {
	// Src is the path on the host.
	Src string
	// Dst is the absolute path in the image.
	Dst string
	// Mode is the file mode in the image. Default: 0755 when the host file
	// is executable by anyone, else 0644; never the host file's other bits,
	// which the umask of whoever built it decides (the image's digest would).
	Mode int64
}

// Spec describes an image made of static binaries on an empty base.
type Spec struct {
	// Files are copied into the image, in one layer.
	Files []File
	// Busybox, when set, is a static busybox binary installed as /bin/busybox
	// with a link for every applet it lists, so the image has a shell.
	Busybox string
	// AppletsFrom, when set, is the busybox binary that is run to list the
	// applets instead of Busybox: one of the same version built for this
	// machine, when Busybox is built for another architecture.
	AppletsFrom string
	// Arch is the image's architecture, in Go's GOARCH terms. Default: amd64.
	Arch string
	// UID and GID the image runs as. Default: 65532, the usual non-root user.
	UID, GID int
	// User is the name given to UID in /etc/passwd. Default: "runner".
	User string
	// Entrypoint, Cmd, WorkingDir and Env go into the image config as they are.
	Entrypoint, Cmd, Env []string
	WorkingDir           string
	// Labels go into the image config.
	Labels map[string]string
}

func (s *Spec) setDefaults() {
	if s.UID == 0 {
		s.UID = 65532
	}
	if s.GID == 0 {
		s.GID = s.UID
	}
	if s.User == "" {
		s.User = "runner"
	}
	if s.Arch == "" {
		s.Arch = "amd64"
	}
	if s.AppletsFrom == "" {
		s.AppletsFrom = s.Busybox
	}
}

// epoch is the modification time of every file in the layer, so the same
// inputs always give the same digest.
var epoch = time.Unix(0, 0).UTC()

// Build assembles the image. The result is reproducible: the same Spec and
// host files give the same image digest.
func Build(s Spec) (v1.Image, error) {
	s.setDefaults()
	layer, err := buildLayer(s)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("adding layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = s.Arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.User = fmt.Sprintf("%d:%d", s.UID, s.GID)
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.Cmd = s.Cmd
	cf.Config.WorkingDir = s.WorkingDir
	cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, s.Env...)
	cf.Config.Labels = s.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("writing config: %w", err)
	}
	return img, nil
}

// entry is one tar entry of the layer.
type entry struct {
	hdr  tar.Header
	data []byte
}

func buildLayer(s Spec) (v1.Layer, error) {
	home := "/home/" + s.User
	entries := map[string]entry{}
	dir := func(p string, mode int64, uid, gid int) {
		entries[p] = entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode, Uid: uid, Gid: gid}}
	}
	file := func(p string, mode int64, data []byte) {
		entries[p] = entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(data))}, data: data}
	}
	for _, d := range []string{"bin", "etc", "usr", "usr/bin", "usr/local", "usr/local/bin", "var", "home"} {
		dir(d, 0o755, 0, 0)
	}
	dir("tmp", 0o1777, 0, 0)
	dir(strings.TrimPrefix(home, "/"), 0o755, s.UID, s.GID)
	file("etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:%s:%s:/bin/sh\n", s.User, s.UID, s.GID, s.User, home))
	file("etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\n%s:x:%d:\n", s.User, s.GID))

	if s.Busybox != "" {
		data, err := os.ReadFile(s.Busybox)
		if err != nil {
			return nil, fmt.Errorf("reading busybox: %w", err)
		}
		if err := checkArch(s.Busybox, data, s.Arch); err != nil {
			return nil, err
		}
		file("bin/busybox", 0o755, data)
		applets, err := busyboxApplets(s.AppletsFrom)
		if err != nil {
			return nil, err
		}
		for _, a := range applets {
			p := "bin/" + a
			if _, taken := entries[p]; taken {
				continue
			}
			entries[p] = entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: "busybox", Mode: 0o777}}
		}
	}
	for _, f := range s.Files {
		if !path.IsAbs(f.Dst) {
			return nil, fmt.Errorf("file %s: destination %q must be an absolute path", f.Src, f.Dst)
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", f.Src, err)
		}
		if err := checkArch(f.Src, data, s.Arch); err != nil {
			return nil, err
		}
		mode := f.Mode
		if mode == 0 {
			st, err := os.Stat(f.Src)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", f.Src, err)
			}
			mode = 0o644
			if st.Mode().Perm()&0o111 != 0 {
				mode = 0o755
			}
		}
		p := strings.TrimPrefix(path.Clean(f.Dst), "/")
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				dir(d, 0o755, 0, 0)
			}
		}
		file(p, mode, data)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := entries[n]
		e.hdr.ModTime = epoch
		e.hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, fmt.Errorf("writing %s: %w", n, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("writing %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing layer: %w", err)
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("making layer: %w", err)
	}
	return layer, nil
}

// machines maps a GOARCH to the ELF machine of its programs.
var machines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"386":     elf.EM_386,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// checkArch refuses an ELF program built for another architecture than the
// image's: such an image would fail only where it runs, with "exec format
// error". Files that are not ELF programs pass.
func checkArch(src string, data []byte, arch string) error {
	if !bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
		return nil
	}
	want, ok := machines[arch]
	if !ok {
		return fmt.Errorf("architecture %q: unknown; known: amd64, arm64, arm, 386, ppc64le, s390x, riscv64", arch)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("reading %s as an ELF program: %w", src, err)
	}
	if f.Machine != want {
		return fmt.Errorf("%s is built for %s, not for the image's architecture %s (%s)", src, f.Machine, arch, want)
	}
	return nil
}

// busyboxApplets lists the applets a busybox binary provides.
func busyboxApplets(bin string) ([]string, error) {
	out, err := exec.Command(bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets of %s: %w", bin, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	return applets, nil
}

package render

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// errReadOnly is returned by every write: building an overlay never writes.
var errReadOnly = errors.New("the post-renderer's file system is read-only")

// overlayFS is the overlay folder on disk with one extra file held in
// memory: Helm's manifests, at the name the kustomization lists. Kustomize
// reads everything else (the kustomization, patches, bases) from disk as it
// would for `kustomize build`; nothing is written anywhere.
type overlayFS struct {
	disk    filesys.FileSystem
	path    string // absolute, cleaned path of the in-memory file
	content []byte
}

var _ filesys.FileSystem = (*overlayFS)(nil)

func newOverlayFS(path string, content []byte) *overlayFS {
	return &overlayFS{disk: newDisk(), path: filepath.Clean(path), content: content}
}

func (f *overlayFS) is(name string) bool {
	abs, err := filepath.Abs(name)
	return err == nil && abs == f.path
}

func (f *overlayFS) Create(string) (filesys.File, error)       { return nil, errReadOnly }
func (f *overlayFS) Mkdir(string) error                        { return errReadOnly }
func (f *overlayFS) MkdirAll(string) error                     { return errReadOnly }
func (f *overlayFS) RemoveAll(string) error                    { return errReadOnly }
func (f *overlayFS) WriteFile(string, []byte) error            { return errReadOnly }
func (f *overlayFS) Walk(p string, fn filepath.WalkFunc) error { return f.disk.Walk(p, fn) }

func (f *overlayFS) Open(name string) (filesys.File, error) {
	if f.is(name) {
		return nil, &os.PathError{Op: "open", Path: name, Err: errors.New("open is not supported for the in-memory manifests; read them")}
	}
	return f.disk.Open(name)
}

func (f *overlayFS) IsDir(name string) bool {
	if f.is(name) {
		return false
	}
	return f.disk.IsDir(name)
}

func (f *overlayFS) ReadDir(name string) ([]string, error) {
	names, err := f.disk.ReadDir(name)
	if err != nil {
		return nil, err
	}
	if abs, aerr := filepath.Abs(name); aerr == nil && abs == filepath.Dir(f.path) {
		if base := filepath.Base(f.path); !slices.Contains(names, base) {
			names = append(names, base)
			slices.Sort(names)
		}
	}
	return names, nil
}

func (f *overlayFS) CleanedAbs(path string) (filesys.ConfirmedDir, string, error) {
	if f.is(path) {
		return filesys.ConfirmedDir(filepath.Dir(f.path)), filepath.Base(f.path), nil
	}
	return f.disk.CleanedAbs(path)
}

func (f *overlayFS) Exists(name string) bool {
	return f.is(name) || f.disk.Exists(name)
}

func (f *overlayFS) Glob(pattern string) ([]string, error) {
	matches, err := f.disk.Glob(pattern)
	if err != nil {
		return nil, err
	}
	if ok, _ := filepath.Match(pattern, f.path); ok && !slices.Contains(matches, f.path) {
		matches = append(matches, f.path)
		slices.Sort(matches)
	}
	return matches, nil
}

// MaxOverlayFileBytes bounds each file of an overlay that is read.
const MaxOverlayFileBytes = 64 << 20

// ErrOverlayFile is an overlay file that is not read: not a regular file
// (a FIFO would block the read for ever, a device such as /dev/zero would
// exhaust memory), or larger than MaxOverlayFileBytes.
var ErrOverlayFile = errors.New("overlay file refused")

func (f *overlayFS) ReadFile(name string) ([]byte, error) {
	if f.is(name) {
		return f.content, nil
	}
	return f.disk.ReadFile(name)
}

// boundedDisk is the file system on disk, reading only regular files of at
// most MaxOverlayFileBytes. Every read of the post-renderer (its own, and
// Kustomize's) goes through it.
type boundedDisk struct{ filesys.FileSystem }

func newDisk() filesys.FileSystem { return boundedDisk{filesys.MakeFsOnDisk()} }

func (d boundedDisk) ReadFile(name string) ([]byte, error) {
	// Stat follows symbolic links: what is checked is what would be read.
	fi, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%w: %s is not a regular file (%s)", ErrOverlayFile, name, fi.Mode().Type())
	case fi.Size() > MaxOverlayFileBytes:
		return nil, fmt.Errorf("%w: %s has %d bytes, more than %d", ErrOverlayFile, name, fi.Size(), MaxOverlayFileBytes)
	}
	return d.FileSystem.ReadFile(name)
}

// Open is not used by Kustomize's build; it is refused rather than left
// unbounded.
func (d boundedDisk) Open(name string) (filesys.File, error) {
	return nil, &os.PathError{Op: "open", Path: name, Err: errors.New("the post-renderer reads whole files only")}
}

// within tells whether path, with every symbolic link resolved, is in dir
// (also resolved).
func within(dir, path string) bool {
	d, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

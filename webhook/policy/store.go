package policy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/runwarden/runwarden/policies"
)

// StoreOptions configure a Store.
type StoreOptions struct {
	// Dir is the policy folder to load and watch. Default: empty, the
	// embedded policies of package policies, which never change.
	Dir string
	// Interval is how often Dir is checked for changes. Default: 2s.
	Interval time.Duration
	// Load configures how every set is loaded and evaluated (its deadline).
	// Default: the zero Options, whose fields state their defaults.
	Load Options
	// OnReload is called after every reload attempt with the new set, or
	// with the error that kept the previous set in force (errors.Is
	// ErrTimeout when an evaluation ran past its deadline). Default: none.
	OnReload func(*Set, error)
}

func (o *StoreOptions) setDefaults() {
	if o.Interval <= 0 {
		o.Interval = 2 * time.Second
	}
	if o.OnReload == nil {
		o.OnReload = func(*Set, error) {}
	}
}

// Store holds the policy set in force and replaces it when the folder
// changes. A set that fails to load (it does not compile, calls a refused
// built-in, fails its tests, or runs past its deadline) is refused: the
// last good set stays in force.
type Store struct {
	opts    StoreOptions
	cur     atomic.Pointer[Set]
	content string // digest of the folder at the last reload attempt
}

// NewStore loads the first policy set; it fails if that set is refused.
func NewStore(ctx context.Context, opts StoreOptions) (*Store, error) {
	opts.setDefaults()
	s := &Store{opts: opts}
	fsys, origin := s.source()
	if opts.Dir != "" {
		// Before loading: a change made while the set loads is then seen
		// by the next Check, not taken for the set in force.
		s.content, _ = folderDigest(fsys)
	}
	set, err := Load(ctx, fsys, origin, s.opts.Load)
	if err != nil {
		return nil, err
	}
	s.cur.Store(set)
	return s, nil
}

func (s *Store) source() (fs.FS, string) {
	if s.opts.Dir == "" {
		return policies.FS, "embedded policies"
	}
	return os.DirFS(s.opts.Dir), s.opts.Dir
}

// Current returns the policy set in force.
func (s *Store) Current() *Set { return s.cur.Load() }

// Run checks the folder every Interval until ctx ends, reloading on change.
func (s *Store) Run(ctx context.Context) error {
	if s.opts.Dir == "" {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Check(ctx)
		}
	}
}

// Check reloads the folder if its content changed since the last attempt.
func (s *Store) Check(ctx context.Context) {
	fsys, origin := s.source()
	digest, err := folderDigest(fsys)
	if err != nil {
		s.opts.OnReload(nil, fmt.Errorf("reading %s: %w", origin, err))
		return
	}
	if digest == s.content {
		return
	}
	s.content = digest
	set, err := Load(ctx, fsys, origin, s.opts.Load)
	if err != nil {
		s.opts.OnReload(nil, err)
		return
	}
	s.cur.Store(set)
	s.opts.OnReload(set, nil)
}

// folderDigest hashes the names and contents of the .rego files.
func folderDigest(fsys fs.FS) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != "." && strings.HasPrefix(d.Name(), "..") {
			return fs.SkipDir
		}
		if d.IsDir() || path.Ext(p) != ".rego" || strings.HasPrefix(d.Name(), "..") {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		return nil
	})
	return fmt.Sprintf("%x", h.Sum(nil)), err
}

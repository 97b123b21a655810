package steps

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
)

// CloneOptions say what a checkout step clones.
type CloneOptions struct {
	// Server is the forge's URL (github.server_url).
	Server string
	// Repository is owner/name.
	Repository string
	// Ref is a branch or tag, short or full (refs/heads/main), or a
	// commit; "" is the repository's default branch.
	Ref string
	// Commit, when set, is checked out after the clone (the job's commit
	// on its ref).
	Commit string
	// Dir is where to.
	Dir string
	// Token is the password of the clone's basic authentication (a Gitea
	// job's token while the job runs).
	Token string
}

// RepoURL is the git URL of repository (owner/name) on the forge at
// server (github.server_url).
func RepoURL(server, repository string) string {
	return strings.TrimSuffix(server, "/") + "/" + repository + ".git"
}

// Clone clones a repository as actions/checkout does for a job: the ref's
// history into Dir, then the commit checked out. It runs in the runner pod
// with go-git, so the job's image needs no git.
func Clone(ctx context.Context, o CloneOptions, out io.Writer) error {
	url := RepoURL(o.Server, o.Repository)
	opts := &git.CloneOptions{URL: url, Progress: nil, Tags: git.NoTags}
	if o.Token != "" {
		opts.Auth = &githttp.BasicAuth{Username: "runwarden", Password: o.Token}
	}
	commit := o.Commit
	switch {
	case o.Ref == "":
	case plumbing.IsHash(o.Ref):
		commit = o.Ref
	case strings.HasPrefix(o.Ref, "refs/"):
		opts.ReferenceName, opts.SingleBranch = plumbing.ReferenceName(o.Ref), true
	default:
		opts.ReferenceName, opts.SingleBranch = plumbing.NewBranchReferenceName(o.Ref), true
	}
	_, _ = fmt.Fprintf(out, "runwarden: checking out %s (%s) into %s\n", o.Repository, firstOf(o.Ref, commit, "its default branch"), o.Dir)
	repo, err := git.PlainCloneContext(ctx, o.Dir, false, opts)
	if err != nil && opts.ReferenceName.IsBranch() && strings.Contains(err.Error(), "reference not found") {
		// A short name may be a tag.
		if rmErr := os.RemoveAll(filepath.Join(o.Dir, ".git")); rmErr != nil {
			return rmErr
		}
		opts.ReferenceName = plumbing.NewTagReferenceName(o.Ref)
		repo, err = git.PlainCloneContext(ctx, o.Dir, false, opts)
	}
	if err != nil {
		return fmt.Errorf("cloning %s: %w", url, err)
	}
	if commit == "" {
		return nil
	}
	wt, err := repo.Worktree()
	if err != nil {
		return err
	}
	if err := wt.Checkout(&git.CheckoutOptions{Hash: plumbing.NewHash(commit), Force: true}); err != nil {
		return fmt.Errorf("checking out %s: %w", commit, err)
	}
	return nil
}

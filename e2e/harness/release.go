package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Release is what `make release` (hack/release.sh) pushed to a registry, as
// its release.json records it.
type Release struct {
	Version  string `json:"version"`
	Registry string `json:"registry"`
	Chart    struct {
		// Ref is the chart's oci:// reference, without the version.
		Ref     string `json:"ref"`
		Version string `json:"version"`
		Digest  string `json:"digest"`
	} `json:"chart"`
	// Images by name (dispatcher, webhook, postrender, runner).
	Images map[string]ReleasedImage `json:"images"`

	// Dir holds release.json, the SBOMs, the chart package and cosign.pub.
	Dir string `json:"-"`
	// CAFile is the CA the registry's certificate is checked against.
	CAFile string `json:"-"`
}

// ReleasedImage is one multi-platform image of a release.
type ReleasedImage struct {
	// Ref is REGISTRY/NAME:VERSION.
	Ref string `json:"ref"`
	// Digest is the index's digest.
	Digest string `json:"digest"`
	// Platforms maps OS/ARCH to that platform's image digest.
	Platforms map[string]string `json:"platforms"`
}

// Repository returns the image's reference without its tag.
func (i ReleasedImage) Repository() string { return i.Ref[:strings.LastIndex(i.Ref, ":")] }

// ByDigest returns the image's reference by its index digest.
func (i ReleasedImage) ByDigest() string { return i.Repository() + "@" + i.Digest }

// Release runs hack/release.sh into dir, pushing to the local registry
// (hack/registry.sh), and reads what it pushed.
func (c Config) Release(ctx context.Context, dir string) (*Release, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "release.sh"))
	cmd.Dir = c.RepoRoot
	cmd.Env = append(os.Environ(), "RELEASE_OUT="+dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("hack/release.sh: %w\n%s", err, out.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "release.json"))
	if err != nil {
		return nil, err
	}
	r := &Release{Dir: dir}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("release.json: %w", err)
	}
	ca, err := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "registry.sh"), "ca").Output()
	if err != nil {
		return nil, fmt.Errorf("hack/registry.sh ca: %w", err)
	}
	r.CAFile = strings.TrimSpace(string(ca))
	return r, nil
}

// Cosign runs the pinned cosign (hack/tools.sh cosign) against the release's
// registry, trusting its CA, and returns its stdout; stderr is in the error.
func (c Config) Cosign(ctx context.Context, r *Release, args ...string) (string, error) {
	dir, err := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "tools.sh"), "path", "cosign").Output()
	if err != nil {
		return "", fmt.Errorf("hack/tools.sh path cosign: %w", err)
	}
	if len(args) > 0 && args[0] != "generate-key-pair" {
		args = append(args[:1:1], append([]string{"--registry-cacert", r.CAFile}, args[1:]...)...)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(strings.TrimSpace(string(dir)), "cosign"), args...)
	// Keys made here have an empty password.
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("cosign %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

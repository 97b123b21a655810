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

	corev1 "k8s.io/api/core/v1"
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

// ImagesByDigest returns every image of the release by its index digest.
func (r *Release) ImagesByDigest() []string {
	refs := make([]string, 0, len(r.Images))
	for _, im := range r.Images {
		refs = append(refs, im.ByDigest())
	}
	return refs
}

// ChartByDigest returns the chart's oci:// reference by the digest that was
// signed: what to verify and to install, so that nothing pushed to its tag
// in between is installed.
func (r *Release) ChartByDigest() string { return r.Chart.Ref + "@" + r.Chart.Digest }

// UnreleasedContainers names each container of p (init, regular and
// ephemeral ones alike) whose image, or the image its node pulled (its
// status's imageID), is not one of released, and each that has no status:
// every container of a release pod is checked, not only the first. An
// empty result means every container runs a released image.
func UnreleasedContainers(p *corev1.Pod, released []string) []string {
	ok := map[string]bool{}
	for _, ref := range released {
		ok[ref] = true
	}
	type container struct{ kind, name, image string }
	var specs []container
	for _, c := range p.Spec.InitContainers {
		specs = append(specs, container{"init container", c.Name, c.Image})
	}
	for _, c := range p.Spec.Containers {
		specs = append(specs, container{"container", c.Name, c.Image})
	}
	for _, c := range p.Spec.EphemeralContainers {
		specs = append(specs, container{"ephemeral container", c.Name, c.Image})
	}
	pulled := map[string]string{}
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, s := range statuses {
			pulled[s.Name] = s.ImageID
		}
	}
	var bad []string
	for _, c := range specs {
		id, seen := pulled[c.name]
		switch {
		case !ok[c.image]:
			bad = append(bad, fmt.Sprintf("pod %s: %s %s names image %q, not one of the release's by digest", p.Name, c.kind, c.name, c.image))
		case !seen:
			bad = append(bad, fmt.Sprintf("pod %s: %s %s has no status: what it runs is unknown", p.Name, c.kind, c.name))
		case !ok[id]:
			bad = append(bad, fmt.Sprintf("pod %s: %s %s runs %q, not one of the release's images", p.Name, c.kind, c.name, id))
		}
	}
	return bad
}

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

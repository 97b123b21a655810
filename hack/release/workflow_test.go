package main

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// workflow is the part of a GitHub Actions workflow these tests read (YAML
// 1.2, as GitHub reads it: "on" is a key, not a boolean).
type workflow struct {
	On struct {
		Push struct {
			Tags []string `yaml:"tags"`
		} `yaml:"push"`
	} `yaml:"on"`
	Jobs map[string]struct {
		// Container is the job's image (the short form, a string).
		Container   string            `yaml:"container"`
		Permissions map[string]string `yaml:"permissions"`
		Env         map[string]string `yaml:"env"`
		Steps       []struct {
			Uses string            `yaml:"uses"`
			Run  string            `yaml:"run"`
			Env  map[string]string `yaml:"env"`
			With map[string]any    `yaml:"with"`
		} `yaml:"steps"`
	} `yaml:"jobs"`
}

// The release workflow stays in step with `make release`: it calls it, sets
// only settings hack/release.sh reads, and signs keyless with the OIDC
// token it is given. It builds in an image pinned by digest, checked to be
// the Go its tag names, and no checkout leaves the job's token in
// .git/config.
func TestReleaseWorkflowCallsMakeRelease(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var w workflow
	if err := yaml.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(root, "hack", "release.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if len(w.On.Push.Tags) == 0 {
		t.Error("the workflow runs on no tag push")
	}
	job, ok := w.Jobs["release"]
	if !ok {
		t.Fatalf("no release job in %v", w.Jobs)
	}
	image := regexp.MustCompile(`^golang:(\d+\.\d+\.\d+)-bookworm@sha256:[0-9a-f]{64}$`).FindStringSubmatch(job.Container)
	if image == nil {
		t.Errorf("the release job's container %q: pin it by digest, golang:X.Y.Z-bookworm@sha256:<64 hex>", job.Container)
	}
	calls, checkouts, goChecked := 0, 0, false
	pinned := regexp.MustCompile(`^[\w.-]+/[\w.-]+@[0-9a-f]{40}$`)
	for _, s := range job.Steps {
		if strings.TrimSpace(s.Run) == "make release" {
			calls++
		}
		if image != nil && strings.Contains(s.Run, `test "$(go env GOVERSION)" = go`+image[1]+" ") {
			goChecked = true
		}
		if s.Uses != "" && !pinned.MatchString(s.Uses) {
			t.Errorf("step uses %q: pin actions to a full commit SHA", s.Uses)
		}
		if strings.HasPrefix(s.Uses, "actions/checkout@") {
			checkouts++
			if s.With["persist-credentials"] != false {
				t.Errorf("step uses %s with persist-credentials %v: set it to false, or the job's token stays in .git/config", s.Uses, s.With["persist-credentials"])
			}
		}
	}
	if checkouts == 0 {
		t.Error("the release job checks nothing out")
	}
	if image != nil && !goChecked {
		t.Errorf("no step checks that the pinned image's Go is go%s, which its tag names", image[1])
	}
	if calls != 1 {
		t.Errorf("the release job runs `make release` %d times, want once", calls)
	}
	for k := range job.Env {
		if strings.HasPrefix(k, "RELEASE_") && !strings.Contains(string(script), "#   "+k+" ") {
			t.Errorf("the workflow sets %s, which hack/release.sh does not document reading", k)
		}
	}
	if job.Env["RELEASE_KEYLESS"] != "true" {
		t.Error("the workflow signs with a key; releases are signed keyless (docs/release.md)")
	}
	// Pushing needs packages: write, keyless signing id-token: write; no
	// more.
	want := map[string]string{"contents": "read", "packages": "write", "id-token": "write"}
	if !maps.Equal(job.Permissions, want) {
		t.Errorf("the release job's permissions %v, want exactly %v", job.Permissions, want)
	}
}

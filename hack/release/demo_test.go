package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// make demo verifies the chart by the digest make release signed and
// installs that same digest, never a tag or --version, and checks every
// container of the release pods, init containers included. The chart e2e
// test proves the same path against a registry whose tag was moved
// (TestChartInstallsAndRunsTasks); this keeps the script on it.
func TestDemoVerifiesAndInstallsTheChartByDigest(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "hack", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	// Each command as one line: continuation lines joined.
	lines := strings.Split(strings.ReplaceAll(script, "\\\n", " "), "\n")
	ref := regexp.MustCompile(`^chart_ref=\$RELEASE_CHART@\$RELEASE_CHART_DIGEST$`)
	refs, installs, verifies := 0, 0, 0
	for _, line := range lines {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "echo ") {
			continue
		}
		if ref.MatchString(line) {
			refs++
		}
		if strings.Contains(line, `"$helm_bin"`) && (strings.Contains(line, " install ") || strings.Contains(line, " upgrade ")) {
			installs++
			if !strings.Contains(line, `"$chart_ref"`) || strings.Contains(line, "--version") || strings.Contains(line, "$RELEASE_CHART_VERSION") {
				t.Errorf("hack/demo.sh installs the chart with %q: install \"$chart_ref\" (by digest), with no --version", line)
			}
		}
		if strings.HasPrefix(line, "cosign_verify verify") && strings.Contains(strings.ToLower(line), "chart") {
			verifies++
			if !strings.Contains(line, `"${chart_ref#oci://}"`) {
				t.Errorf("hack/demo.sh verifies the chart with %q: verify \"${chart_ref#oci://}\", the digest it installs", line)
			}
		}
	}
	if refs != 1 || installs != 1 || verifies != 1 {
		t.Errorf("hack/demo.sh sets chart_ref to the signed digest %d times, installs the chart %d times, verifies it %d times; want once each", refs, installs, verifies)
	}
	for _, want := range []string{".spec.initContainers", ".status.initContainerStatuses", ".spec.containers", ".status.containerStatuses"} {
		if !strings.Contains(script, want) {
			t.Errorf("hack/demo.sh's check of the release pods does not read %s: every container is checked, not only the first", want)
		}
	}
	if strings.Contains(script, "containerStatuses[0]") {
		t.Error("hack/demo.sh checks containerStatuses[0]: check every container")
	}
}

// make demo builds only what it shows, so its first run on an empty tool
// cache stays within the time the README gives: the host's platform, no
// SBOMs. make release and make e2e (whose chart test releases for arm64 with
// SBOMs and checks their attestations) still build the rest.
func TestDemoBuildsOnlyWhatItShows(t *testing.T) {
	t.Parallel()
	read := func(name string) []string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		// Each command as one line: continuation lines joined.
		return strings.Split(strings.ReplaceAll(string(b), "\\\n", " "), "\n")
	}
	// toolLines are the lines that build tools: hack/tools.sh with tool names.
	toolLines := func(lines []string) string {
		var b strings.Builder
		for _, line := range lines {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") || strings.Contains(line, "tools.sh path") {
				continue
			}
			if strings.Contains(line, "hack/tools.sh ") {
				b.WriteString(line + "\n")
			}
		}
		return b.String()
	}
	demo := read("hack/demo.sh")
	var release string
	for _, line := range demo {
		if strings.Contains(line, "hack/release.sh") && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			release += line + "\n"
		}
	}
	makefile := read("Makefile")
	target := func(name string) []string {
		var out []string
		in := false
		for _, line := range makefile {
			switch {
			case strings.HasPrefix(line, name+":"):
				in = true
			case in && !strings.HasPrefix(line, "\t"):
				return out
			case in:
				out = append(out, line)
			}
		}
		return out
	}
	for _, c := range []struct {
		name, text, want, not string
	}{
		{"demo releases for the host's platform", release, "RELEASE_PLATFORMS=linux/$arch", ""},
		{"demo releases without SBOMs", release, "RELEASE_SBOM=false", ""},
		{"demo builds no syft", toolLines(demo), "", "syft"},
		{"demo builds no arm64 OpenTofu", toolLines(demo), "", "opentofu-linux-"},
		{"demo fetches no other busybox", toolLines(demo), "", "busybox-linux-"},
		{"make e2e builds syft", toolLines(target("e2e")), "syft", ""},
		{"make e2e builds the arm64 OpenTofu", toolLines(target("e2e")), "opentofu-linux-arm64", ""},
		{"make release builds syft", toolLines(target("release")), "syft", ""},
		{"make release builds the arm64 OpenTofu", toolLines(target("release")), "opentofu-linux-arm64", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.text == "" {
				t.Fatal("no lines found to check: the script or target changed shape")
			}
			if c.want != "" && !strings.Contains(c.text, c.want) {
				t.Errorf("want %q in:\n%s", c.want, c.text)
			}
			if c.not != "" && strings.Contains(c.text, c.not) {
				t.Errorf("want no %q in:\n%s", c.not, c.text)
			}
		})
	}
}

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

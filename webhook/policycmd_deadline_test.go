package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The offline commands load the policies as the server does: with its
// capabilities and deadline.
func TestPolicyCommandsUseTheServersLimits(t *testing.T) {
	t.Parallel()
	const decision = `package runwarden.admission

decision := {"deny": [], "warnings": [], "mutations": {}} if not input.config.slow

decision := {"deny": [], "warnings": [sprintf("%d", [n])], "mutations": {}} if {
	input.config.slow
	n := count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)])
}
`
	slowTest := "package runwarden.admission_test\n\ntest_slow if count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)]) > 0\n"
	httpSend := strings.Replace(decision, "if not input.config.slow", "if {\n\tnot input.config.slow\n\thttp.send({\"method\": \"GET\", \"url\": \"http://example.invalid\"}).status_code == 200\n}", 1)
	dir := func(files map[string]string) string {
		d := t.TempDir()
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(d, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	slowConfig := filepath.Join(dir(map[string]string{"platform.yaml": "slow: true\n"}), "platform.yaml")
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr []string
	}{
		{
			name:     "policy test of a set whose test is slow",
			args:     []string{"policy", "test", "--timeout", "300ms", dir(map[string]string{"a.rego": decision, "a_test.rego": slowTest})},
			wantCode: 1, wantStderr: []string{"test_slow", "a_test.rego:3) ran past the deadline of 300ms"},
		},
		{
			name:     "policy test of a set whose test is slow, within the total deadline",
			args:     []string{"policy", "test", "--timeout", "1h", "--total-timeout", "300ms", dir(map[string]string{"a.rego": decision, "a_test.rego": slowTest})},
			wantCode: 1, wantStderr: []string{"test_slow", "ran past their total deadline of 300ms"},
		},
		{
			name:     "policy test with no total deadline",
			args:     []string{"policy", "test", "--total-timeout", "0s"},
			wantCode: 2, wantStderr: []string{"--total-timeout 0s: each must be more than 0"},
		},
		{
			name:     "policy test of a set calling http.send",
			args:     []string{"policy", "test", dir(map[string]string{"a.rego": httpSend})},
			wantCode: 1, wantStderr: []string{"a.rego:5", "http.send is not allowed"},
		},
		{
			name:     "policy eval of a pod a rule is slow on",
			args:     []string{"policy", "eval", "--timeout", "300ms", "--pod", "testdata/valid-pod.yaml", "--config", slowConfig, "--policies", dir(map[string]string{"a.rego": decision})},
			wantCode: 3, wantStderr: []string{"took longer than 300ms"},
		},
		{
			name:     "policy eval with policies calling http.send",
			args:     []string{"policy", "eval", "--pod", "testdata/valid-pod.yaml", "--policies", dir(map[string]string{"a.rego": httpSend})},
			wantCode: 3, wantStderr: []string{"a.rego:5", "http.send is not allowed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(t.Context(), tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

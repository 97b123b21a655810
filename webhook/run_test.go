package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/runwarden/runwarden/internal/helpdoc"
)

func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout []string
		notStdout  []string
		wantStderr []string
	}{
		{name: "version", args: []string{"--version"}, wantStdout: []string{"runwarden-webhook "}},
		{name: "help", args: []string{"--help"}, wantStdout: []string{"policy eval", "policy test"}},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2, wantStderr: []string{`unknown command "frobnicate"`}},
		{name: "policy without subcommand", args: []string{"policy"}, wantCode: 2},
		{name: "policy help", args: []string{"policy", "--help"}, wantStdout: []string{"policy eval", "--min-coverage"}},
		{name: "serve zero reload interval", args: []string{"--cert-mode", "provided", "--policy-reload-interval", "0s"}, wantCode: 2, wantStderr: []string{"--policy-reload-interval 0s: must be more than 0"}},
		{name: "serve zero policy timeout", args: []string{"--cert-mode", "provided", "--policy-timeout", "0s"}, wantCode: 2, wantStderr: []string{"--policy-timeout 0s: must be more than 0"}},
		{name: "serve pod name without its namespace", args: []string{"--cert-mode", "provided", "--pod-name", "webhook-0"}, wantCode: 2, wantStderr: []string{"--pod-name and --pod-namespace go together"}},
		{name: "serve help names the policy timeout", args: []string{"serve", "--help"}, wantStderr: []string{"-policy-timeout duration", "(default 2s)"}},
		{name: "serve needs cert hosts", args: []string{"serve"}, wantCode: 2, wantStderr: []string{"--cert-hosts"}},
		{name: "serve bad cert mode", args: []string{"serve", "--cert-mode", "x"}, wantCode: 2, wantStderr: []string{"--cert-mode"}},
		{name: "serve bad runner namespace", args: []string{"--cert-mode", "provided", "--runner-namespace", "Team_A"}, wantCode: 2, wantStderr: []string{`--runner-namespace "Team_A"`}},
		{name: "serve bad port", args: []string{"--cert-mode", "provided", "--port", "0"}, wantCode: 2, wantStderr: []string{"--port 0"}},
		{name: "policy capabilities", args: []string{"policy", "capabilities"}, wantStdout: []string{`"name": "time.now_ns"`, `"allow_net": []`}},
		{name: "policy capabilities with an argument", args: []string{"policy", "capabilities", "x"}, wantCode: 2, wantStderr: []string{"unexpected arguments"}},
		{name: "policy test on the shipped policies", args: []string{"policy", "test", "--min-coverage", "90"}, wantStdout: []string{"tests passed, coverage"}},
		{name: "policy test below a coverage floor", args: []string{"policy", "test", "--min-coverage", "100.1"}, wantCode: 1, wantStderr: []string{"below"}},
		{
			name:       "policy eval shapes a pod",
			args:       []string{"policy", "eval", "--pod", "testdata/valid-pod.yaml", "--service-account", "testdata/service-account.yaml", "--namespace", "testdata/namespace.yaml", "--config", "testdata/platform.yaml"},
			wantStdout: []string{"decision:", "AWS_ROLE_ARN", "arn:aws:iam::111122223333:role/runner", "runwarden.dev/pool: team-a", "pod:", "# NOT CHECKED: whether the pod's Job task-42", "no --job given"},
		},
		{
			name:       "policy eval admits a pod as the webhook does",
			args:       []string{"policy", "eval", "--pod", "testdata/valid-pod.yaml", "--service-account", "testdata/service-account.yaml", "--namespace", "testdata/namespace.yaml", "--config", "testdata/platform.yaml", "--job", "testdata/job.yaml", "--resolver-image", "registry.example.com/runwarden/webhook:1"},
			wantStdout: []string{"mutating webhook: mutated; validating webhook: allowed", "fileKeyRef", "image: registry.example.com/runwarden/webhook:1", "name: runwarden-secrets", "runwarden.dev/spec-digest: sha256:", "runwarden.dev/policy-digest:", "runwarden.dev/mutations:"},
			notStdout:  []string{"NOT CHECKED", "${vault:"},
		},
		{
			name:       "policy eval of a runner pod whose Job is not the dispatcher's",
			args:       []string{"policy", "eval", "--pod", "testdata/invalid-pod.yaml", "--job", "testdata/job.yaml"},
			wantCode:   1,
			wantStdout: []string{"DENIED", "its Job task-43 does not exist"},
		},
		{
			name:       "policy eval with the namespace of another pod",
			args:       []string{"policy", "eval", "--pod", "testdata/valid-pod.yaml", "--namespace", "testdata/service-account.yaml"},
			wantCode:   2,
			wantStderr: []string{`is namespace "runner", and the pod is in "team-a"`},
		},
		{
			name: "policy eval of a denied pod", args: []string{"policy", "eval", "--pod", "testdata/invalid-pod.yaml"},
			wantCode:   1,
			wantStdout: []string{"no-host-namespaces", "secret-ref-malformed", "expected ${azure:<secret-name>@<vault-name>}", "DENIED"},
		},
		{
			name: "policy eval prints the action of every violation", args: []string{"policy", "eval", "--pod", "testdata/invalid-pod.yaml"},
			wantCode:   1,
			wantStdout: []string{"# action deny: no-host-namespaces: the pod uses the host's namespaces (hostNetwork)", "# action deny: secret-ref-malformed: container \"main\" env TOKEN"},
		},
		{
			name: "policy eval of a pod whose violations the platform warns of and dry-runs", args: []string{"policy", "eval", "--pod", "testdata/shape-pod.yaml", "--config", "testdata/platform-enforcement.yaml"},
			wantStdout: []string{
				"# action dryrun: no-host-namespaces: the pod uses the host's namespaces (hostNetwork)",
				"# action warn: no-privileged: container \"main\" is privileged",
				"audit: would deny: no-privileged",
				"# the pod would be admitted",
			},
			notStdout: []string{"DENIED", "# action deny"},
		},
		{
			name: "policy eval with a secret-reference rule relaxed", args: []string{"policy", "eval", "--pod", "testdata/invalid-pod.yaml", "--config", "testdata/platform-relaxes-secret-refs.yaml"},
			wantCode:   2,
			wantStderr: []string{"enforcement.namespaces.team-a.secret-ref-malformed: warn: the secret-reference rules (secret-ref-*) always deny"},
		},
		{
			name: "policy eval with an action that is not one", args: []string{"policy", "eval", "--pod", "testdata/invalid-pod.yaml", "--config", "testdata/invalid-platform-enforcement.yaml"},
			wantCode:   2,
			wantStderr: []string{"platform configuration testdata/invalid-platform-enforcement.yaml: enforcement.rules.no-host-namespaces: audit is not an action; use deny, warn, dryrun"},
		},
		{
			name:     "policy eval of a pod whose volumes clash with the mutations",
			args:     []string{"policy", "eval", "--pod", "testdata/clashing-pod.yaml", "--service-account", "testdata/service-account.yaml", "--config", "testdata/platform.yaml"},
			wantCode: 1, wantStdout: []string{"DENIED", "/var/run/secrets/eks.amazonaws.com/serviceaccount"},
		},
		{
			name:     "policy eval with policies that do not load is not a denial",
			args:     []string{"policy", "eval", "--pod", "testdata/invalid-pod.yaml", "--policies", "testdata"},
			wantCode: 3, wantStderr: []string{"no .rego files"},
		},
		{
			name:     "policy eval of a runner pod another user creates",
			args:     []string{"policy", "eval", "--pod", "testdata/valid-pod.yaml", "--config", "testdata/platform.yaml", "--user", "system:serviceaccount:team-a:intruder"},
			wantCode: 1, wantStdout: []string{"DENIED", "it is created by system:serviceaccount:team-a:intruder, not by the Job controller"},
		},
		{name: "policy eval needs a pod", args: []string{"policy", "eval"}, wantCode: 2, wantStderr: []string{"--pod is required"}},
		{name: "policy eval of a missing file", args: []string{"policy", "eval", "--pod", "testdata/none.yaml"}, wantCode: 2, wantStderr: []string{"none.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tt.notStdout {
				if strings.Contains(stdout.String(), w) {
					t.Errorf("stdout holds %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// Every flag each subcommand's --help lists is in docs/webhook.md or
// docs/policy.md.
func TestDocsNameEveryFlag(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"serve", "--help"}, {"policy", "eval", "--help"}, {"policy", "test", "--help"}, {"policy", "audit", "--help"}, {"resolve", "--help"}} {
		var out, errOut bytes.Buffer
		run(t.Context(), args, &out, &errOut)
		help := out.String() + errOut.String()
		missing, err := helpdoc.Missing(help, "../docs/webhook.md", "../docs/policy.md")
		if err != nil {
			t.Fatal(err)
		}
		if len(helpdoc.Flags(help)) == 0 || len(missing) > 0 {
			t.Errorf("%v: the docs lack flags %v (help:\n%s)", args, missing, help)
		}
	}
}

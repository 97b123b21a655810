package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/runwarden/runwarden/dispatcher/preflight"
	"github.com/runwarden/runwarden/internal/helpdoc"
)

func TestRunRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	badTmpl := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badTmpl, []byte("spec:\n  restartPolicy: Always\n  containers:\n  - name: runner\n    image: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("spec:\n  containerz: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string
		code int
	}{
		{name: "version", args: []string{"--version"}, code: 0},
		{name: "leader election without a namespace", args: []string{"--dispatcher-id", "d", "--leader-elect", "--namespace", "runners"}, code: 2, want: []string{"--leader-elect needs --leader-elect-namespace"}},
		{name: "leader election in the runner namespace", args: []string{"--dispatcher-id", "d", "--leader-elect", "--namespace", "runners", "--leader-elect-namespace", "runners"}, code: 2, want: []string{`--leader-elect-namespace "runners": not in --namespace runners, where runner Jobs run: whoever may write Leases`}},
		{name: "leader election timings out of order", args: []string{"--dispatcher-id", "d", "--leader-elect", "--namespace", "runners", "--leader-elect-namespace", "runwarden", "--leader-elect-renew-deadline", "20s"}, code: 2, want: []string{"each must be shorter than the next"}},
		{name: "bad id", args: []string{"--dispatcher-id", "not a label!"}, code: 2, want: []string{"--dispatcher-id"}},
		{name: "bad concurrency", args: []string{"--dispatcher-id", "d", "--max-concurrent", "0"}, code: 2, want: []string{"--max-concurrent 0"}},
		{name: "two templates", args: []string{"--dispatcher-id", "d", "--pod-template", "t.yaml", "--pod-template-object", "ns/t"}, code: 2, want: []string{"--pod-template and --pod-template-object: give one"}},
		{name: "template object in the runner namespace", args: []string{"--dispatcher-id", "d", "--namespace", "runners", "--pod-template-object", "runners/t"}, code: 2, want: []string{`--pod-template-object "runners/t": not in --namespace runners, where runner Jobs run: whoever may write PodTemplates there`}},
		{name: "template object without a namespace", args: []string{"--dispatcher-id", "d", "--pod-template-object", "t"}, code: 2, want: []string{`--pod-template-object "t": want NAMESPACE/NAME`}},
		{name: "too much log kept", args: []string{"--dispatcher-id", "d", "--keep-log-bytes", "2000000"}, code: 2, want: []string{"--keep-log-bytes 2000000"}},
		{name: "bad queue bound", args: []string{"--dispatcher-id", "d", "--kueue", "--max-queued", "0"}, code: 2, want: []string{"--max-queued 0"}},
		{name: "priority class without a value", args: []string{"--dispatcher-id", "d", "--priority-class", "high"}, code: 2, want: []string{`"high": want NAME=VALUE`}},
		{name: "priority class value not a number", args: []string{"--dispatcher-id", "d", "--priority-class", "high=x"}, code: 2, want: []string{"must be a whole number"}},
		{name: "priority class twice", args: []string{"--dispatcher-id", "d", "--priority-class", "high=1", "--priority-class", "high=2"}, code: 2, want: []string{"given twice"}},
		{name: "priority classes with Kueue", args: []string{"--dispatcher-id", "d", "--kueue", "--priority-class", "high=1"}, code: 2, want: []string{"with --kueue, tasks name Kueue WorkloadPriorityClasses"}},
		{name: "default queue without Kueue", args: []string{"--dispatcher-id", "d", "--default-queue", "team-a"}, code: 2, want: []string{"--default-queue needs --kueue"}},
		{name: "unknown default priority class", args: []string{"--dispatcher-id", "d", "--priority-class", "high=1", "--default-priority-class", "low"}, code: 2, want: []string{`--default-priority-class "low": not one of the --priority-class names`}},
		{name: "invalid default queue", args: []string{"--dispatcher-id", "d", "--kueue", "--default-queue", "Team_A"}, code: 2, want: []string{`--default-queue "Team_A": not a valid object name`}},
		{name: "bad repo regexp", args: []string{"--dispatcher-id", "d", "--repo-allow", "("}, code: 2, want: []string{"--repo-allow"}},
		{name: "invalid template", args: []string{"--dispatcher-id", "d", "--pod-template", badTmpl}, code: 2, want: []string{`no container named "main"`, "restartPolicy"}},
		{name: "unknown template field", args: []string{"--dispatcher-id", "d", "--pod-template", typo}, code: 2, want: []string{"containerz"}},
		{name: "missing template", args: []string{"--dispatcher-id", "d", "--pod-template", filepath.Join(dir, "none.yaml")}, code: 2, want: []string{"none.yaml"}},
		{name: "id with a comma", args: []string{"--dispatcher-id", "a,b"}, code: 2, want: []string{`--dispatcher-id "a,b"`}},
		{name: "zero deadline", args: []string{"--dispatcher-id", "d", "--default-deadline", "0s"}, code: 2, want: []string{"--default-deadline 0s: must be at least 1s"}},
		{name: "deadline under a second", args: []string{"--dispatcher-id", "d", "--default-deadline", "500ms"}, code: 2, want: []string{"--default-deadline 500ms: must be at least 1s"}},
		{name: "ttl under a second", args: []string{"--dispatcher-id", "d", "--job-ttl", "999ms"}, code: 2, want: []string{"--job-ttl 999ms"}},
		{name: "ttl past int32 seconds", args: []string{"--dispatcher-id", "d", "--job-ttl", "600000h"}, code: 2, want: []string{"--job-ttl 600000h0m0s: must be at most 2147483647s"}},
		{name: "negative ttl", args: []string{"--dispatcher-id", "d", "--job-ttl", "-1h"}, code: 2, want: []string{"--job-ttl -1h0m0s"}},
		{name: "zero unschedulable timeout", args: []string{"--dispatcher-id", "d", "--unschedulable-timeout", "0s"}, code: 2, want: []string{"--unschedulable-timeout"}},
		{name: "zero preflight timeout", args: []string{"--dispatcher-id", "d", "--preflight-timeout", "0s"}, code: 2, want: []string{"--preflight-timeout"}},
		{name: "zero secret GC wait", args: []string{"--dispatcher-id", "d", "--secret-gc-wait", "0s"}, code: 2, want: []string{"--secret-gc-wait 0s: must be at least 1s"}},
		{name: "zero qps", args: []string{"--dispatcher-id", "d", "--kube-api-qps", "0"}, code: 2, want: []string{"--kube-api-qps 0"}},
		{name: "orchestrator flags with kube source", args: []string{"--dispatcher-id", "d", "--poll-wait", "5s", "--stream-logs=false"}, code: 2, want: []string{"--poll-wait, --stream-logs: need --source=orchestrator"}},
		{name: "kube source flags with the orchestrator source", args: []string{"--dispatcher-id", "d", "--source=orchestrator", "--orchestrator-url", "https://o.example", "--namespace", "runners", "--orchestrator-key", "k.pem", "--keep-log-bytes", "1000"}, code: 2, want: []string{"--keep-log-bytes: need --source=kube"}},
		{name: "unknown source", args: []string{"--dispatcher-id", "d", "--source", "gitlab"}, code: 2, want: []string{`--source "gitlab": must be kube, orchestrator or gitea`}},
		{name: "stray argument", args: []string{"--dispatcher-id", "d", "extra"}, code: 2, want: []string{"unexpected arguments"}},
		{name: "unknown secret delivery", args: []string{"--dispatcher-id", "d", "--secret-delivery", "file"}, code: 2, want: []string{`--secret-delivery "file": use envFile or files`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(t.Context(), tt.args, &stdout, &stderr); code != tt.code {
				t.Errorf("exit %d, want %d; stderr %s", code, tt.code, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q: %s", w, stderr.String())
				}
			}
		})
	}
}

// Every flag --help lists is in docs/dispatcher.md.
func TestDocsNameEveryFlag(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	run(t.Context(), []string{"--help"}, &out, &errOut)
	missing, err := helpdoc.Missing(out.String()+errOut.String(), "../docs/dispatcher.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(helpdoc.Flags(out.String()+errOut.String())) < 10 || len(missing) > 0 {
		t.Errorf("docs/dispatcher.md lacks flags %v (help:\n%s%s)", missing, out.String(), errOut.String())
	}
}

// A cluster without EnvFiles is an error when the platform delivers secret
// values in env files, and only worth a note when it delivers them as files.
// (funcr writes "level" on info lines and "error" on error lines.)
func TestLogEnvFiles(t *testing.T) {
	t.Parallel()
	noEnvFiles := fmt.Errorf("%w: the API server dropped it", preflight.ErrNoEnvFiles)
	tests := []struct {
		name     string
		err      error
		delivery string
		want     string // the log line's start, "" for none
	}{
		{name: "env files taken", delivery: "envFile"},
		{name: "env files taken, files chosen", delivery: "files"},
		{name: "no env files", err: noEnvFiles, delivery: "envFile", want: `"msg"="runner variables holding secret references cannot be resolved into env files on this cluster; set the platform configuration's secretDelivery: files`},
		{name: "no env files, files chosen", err: noEnvFiles, delivery: "files", want: `"level"=0 "msg"="this cluster does not take env files; runner variables holding secret references are delivered as files`},
		{name: "check failed", err: errors.New("connection refused"), delivery: "files", want: `"msg"="could not check whether the cluster takes env files" "error"="connection refused"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var lines []string
			logger := funcr.New(func(prefix, args string) { lines = append(lines, prefix+args) }, funcr.Options{})
			logEnvFiles(logger, tt.err, tt.delivery)
			switch {
			case tt.want == "" && len(lines) > 0:
				t.Errorf("logged %q, want nothing", lines)
			case tt.want != "" && (len(lines) != 1 || !strings.HasPrefix(lines[0], tt.want)):
				t.Errorf("logged %q, want one line starting %s", lines, tt.want)
			}
		})
	}
}

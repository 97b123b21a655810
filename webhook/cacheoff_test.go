package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"

	"github.com/runwarden/runwarden/webhook/metrics"
	"github.com/runwarden/runwarden/webhook/policy"
)

// A policy set whose decision cache is off: lib/clock.rego calls
// time.now_ns on its line 5.
var uncachedSet = map[string]string{
	"decision.rego":       "package runwarden.admission\n\ndecision := {\"deny\": [], \"warnings\": [], \"mutations\": {}}\n",
	"decision_test.rego":  "package runwarden.admission_test\n\ntest_decision if data.runwarden.admission.decision.deny == []\n",
	"lib/clock.rego":      "package runwarden.lib\n\n# The time of the decision.\n\nnow := time.now_ns()\n",
	"lib/clock_test.rego": "package runwarden.lib_test\n\ntest_now if data.runwarden.lib.now > 0\n",
}

// The reason of uncachedSet, as the log, policy eval and policy test give it.
const uncachedReason = "lib/clock.rego:5: a call of time.now_ns, a built-in that depends on the clock (impure-builtin)"

// policyDir writes files (a name may hold a folder) to a new folder.
func policyDir(t *testing.T, files map[string]string) string {
	t.Helper()
	d := t.TempDir()
	for name, content := range files {
		p := filepath.Join(d, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// logLines is a logger that keeps what it logs, one JSON-ish line each.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(_, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{})
}

// with returns the lines that hold s.
func (l *logLines) with(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// cacheSeries is runwarden_webhook_decision_cache_enabled by reason.
func cacheSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "runwarden_webhook_decision_cache_enabled" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				out[l.GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// The offline commands tell why the cache is off, as the webhook does,
// and say nothing of it for a cacheable set.
func TestPolicyCommandsTellWhyTheCacheIsOff(t *testing.T) {
	t.Parallel()
	uncached := policyDir(t, uncachedSet)
	tests := []struct {
		name           string
		args           []string
		wantStdout     []string
		wantStderr     []string
		wantCode       int
		wantNoCacheOff bool
	}{
		{
			name:       "policy eval",
			args:       []string{"policy", "eval", "--pod", "testdata/valid-pod.yaml", "--policies", uncached},
			wantStderr: []string{"runwarden-webhook policy eval: " + cacheOffMessage + ": " + uncachedReason},
		},
		{
			name:       "policy test",
			args:       []string{"policy", "test", uncached},
			wantStdout: []string{"2 tests passed", cacheOffMessage + ": " + uncachedReason},
		},
		{
			name:           "policy eval of the shipped policies",
			args:           []string{"policy", "eval", "--pod", "testdata/valid-pod.yaml", "--service-account", "testdata/service-account.yaml", "--namespace", "testdata/namespace.yaml", "--config", "testdata/platform.yaml"},
			wantNoCacheOff: true,
		},
		{
			name:           "policy test of the shipped policies",
			args:           []string{"policy", "test"},
			wantNoCacheOff: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(t.Context(), tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if out := stdout.String() + stderr.String(); tt.wantNoCacheOff && strings.Contains(out, "decision cache") {
				t.Errorf("output tells of the decision cache of a cacheable set:\n%s", out)
			}
		})
	}
}

// The set loaded at start tells why its cache is off, in the log and in
// runwarden_webhook_decision_cache_enabled.
func TestFirstPolicyLoadTellsWhyTheCacheIsOff(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		files       map[string]string
		wantMetric  map[string]float64
		wantLogLine bool
	}{
		{name: "uncached", files: uncachedSet, wantMetric: map[string]float64{"impure-builtin": 0}, wantLogLine: true},
		{name: "shipped", wantMetric: map[string]float64{metrics.CacheOn: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs logLines
			c := serveConfig{reloadInterval: time.Hour}
			if tt.files != nil {
				c.policyDir = policyDir(t, tt.files)
			}
			reg := prometheus.NewRegistry()
			ctx := logr.NewContext(t.Context(), logs.logger())
			if _, err := loadPolicies(ctx, c, nil, metrics.New(reg), nil); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantMetric, cacheSeries(t, reg)); diff != "" {
				t.Errorf("runwarden_webhook_decision_cache_enabled by reason (-want +got):\n%s", diff)
			}
			checkCacheOffLog(t, &logs, tt.wantLogLine)
		})
	}
}

// checkCacheOffLog checks that the log tells once why the cache is off,
// with the file, line and form apart, or, for a cacheable set, nothing.
func checkCacheOffLog(t *testing.T, logs *logLines, want bool) {
	t.Helper()
	lines := logs.with(cacheOffMessage)
	if !want {
		if len(lines) > 0 {
			t.Errorf("log lines %q for a cacheable set", lines)
		}
		return
	}
	if len(lines) != 1 {
		t.Fatalf("log lines %q, want one", lines)
	}
	for _, kv := range []string{`"reason"="` + uncachedReason + `"`, `"form"="impure-builtin"`, `"file"="lib/clock.rego"`, `"line"=5`} {
		if !strings.Contains(lines[0], kv) {
			t.Errorf("log line %s lacks %s", lines[0], kv)
		}
	}
}

// Each reload tells anew whether the new set caches its decisions.
func TestReloadTellsWhyTheCacheIsOff(t *testing.T) {
	t.Parallel()
	var logs logLines
	reg := prometheus.NewRegistry()
	r := reloadReport{log: logs.logger(), rec: metrics.New(reg), events: newPodEventRecorder(record.NewFakeRecorder(4), podRef{namespace: "runwarden", name: "webhook-0", uid: "u"})}
	uncached, err := policy.Load(t.Context(), os.DirFS(policyDir(t, uncachedSet)), "uncached", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cached, err := policy.Load(t.Context(), os.DirFS(policyDir(t, map[string]string{"decision.rego": uncachedSet["decision.rego"]})), "cached", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.report(cached, nil)
	if diff := cmp.Diff(map[string]float64{metrics.CacheOn: 1}, cacheSeries(t, reg)); diff != "" {
		t.Errorf("after a cacheable set (-want +got):\n%s", diff)
	}
	checkCacheOffLog(t, &logs, false)
	r.report(uncached, nil)
	if diff := cmp.Diff(map[string]float64{"impure-builtin": 0}, cacheSeries(t, reg)); diff != "" {
		t.Errorf("after a set whose cache is off (-want +got):\n%s", diff)
	}
	checkCacheOffLog(t, &logs, true)
	// A refused reload leaves the set in force, and what it says of it.
	r.report(nil, policy.ErrTestsFailed)
	if diff := cmp.Diff(map[string]float64{"impure-builtin": 0}, cacheSeries(t, reg)); diff != "" {
		t.Errorf("after a refused reload (-want +got):\n%s", diff)
	}
}

package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/metrics"
	"github.com/runwarden/runwarden/webhook/policy"
)

// A refused reload says so in the metrics and in a Warning Event on the
// webhook's pod; a timeout counts as one too.
func TestReloadReport(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		set          *policy.Set
		err          error
		wantEvent    string
		wantFailures float64
		wantTimeouts float64
	}{
		{name: "success", set: &policy.Set{Origin: "/p", Digest: "abc", Tests: 3}, wantEvent: "Normal PolicyReloaded policies reloaded from /p: digest abc, 3 tests passed"},
		{
			name:         "compile error",
			err:          fmt.Errorf("%w: a.rego:6: http.send is not allowed", policy.ErrCompile),
			wantEvent:    "Warning PolicyReloadRefused changed policies refused, the last good set stays in force: policies do not compile: a.rego:6: http.send is not allowed",
			wantFailures: 1,
		},
		{
			name:         "timeout",
			err:          fmt.Errorf("deciding on a plain runner pod: %w: took longer than 2s", policy.ErrTimeout),
			wantEvent:    "Warning PolicyReloadRefused changed policies refused, the last good set stays in force: deciding on a plain runner pod: policy evaluation ran past its deadline: took longer than 2s",
			wantFailures: 1, wantTimeouts: 1,
		},
		{
			name:         "long error",
			err:          errors.New(strings.Repeat("x", 5000)),
			wantEvent:    "Warning PolicyReloadRefused changed policies refused, the last good set stays in force: " + strings.Repeat("x", maxEventMessage-len("changed policies refused, the last good set stays in force: ...")) + "...",
			wantFailures: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			events := record.NewFakeRecorder(1)
			r := reloadReport{log: logr.Discard(), rec: metrics.New(reg), events: newPodEventRecorder(events, podRef{namespace: "runwarden", name: "webhook-0", uid: "u"})}
			r.report(tt.set, tt.err)
			if diff := cmp.Diff(tt.wantEvent, <-events.Events); diff != "" {
				t.Errorf("event (-want +got):\n%s", diff)
			}
			if got := counter(t, reg, "runwarden_webhook_policy_reloads_total", "failure"); got != tt.wantFailures {
				t.Errorf("reload failures %v, want %v", got, tt.wantFailures)
			}
			if got := counter(t, reg, "runwarden_webhook_policy_reload_timeouts_total", ""); got != tt.wantTimeouts {
				t.Errorf("reload timeouts %v, want %v", got, tt.wantTimeouts)
			}
		})
	}
}

// A set whose rules the enforcement misnames is reloaded, with a Warning
// Event naming the unknown rules.
func TestReloadReportNamesUnknownEnforcedRules(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	events := record.NewFakeRecorder(2)
	r := reloadReport{log: logr.Discard(), rec: metrics.New(prometheus.NewRegistry()), events: newPodEventRecorder(events, podRef{namespace: "runwarden", name: "webhook-0", uid: "u"}),
		platform: map[string]any{"enforcement": map[string]any{"rules": map[string]any{"no-privileged": "warn", "no-privilegd": "warn"}}}}
	r.report(set, nil)
	if got := <-events.Events; !strings.HasPrefix(got, "Normal PolicyReloaded") {
		t.Errorf("first event %q, want the reload", got)
	}
	want := "Warning UnknownEnforcedRules the platform configuration's enforcement names no-privilegd, which no policy in force denies by (misspelt?): the rule meant keeps its default action"
	if diff := cmp.Diff(want, <-events.Events); diff != "" {
		t.Errorf("event (-want +got):\n%s", diff)
	}
}

// Without a pod (the webhook runs outside one) a refused reload is logged
// and counted, and no Event is attempted.
func TestReloadReportWithoutAPod(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reloadReport{log: logr.Discard(), rec: metrics.New(reg)}.report(nil, policy.ErrTimeout)
	if got := counter(t, reg, "runwarden_webhook_policy_reload_timeouts_total", ""); got != 1 {
		t.Errorf("reload timeouts %v, want 1", got)
	}
}

// counter is the value of a counter series; result selects the result
// label, empty for a counter without labels.
func counter(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if result == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == result) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{result=%q}", name, result)
	return 0
}

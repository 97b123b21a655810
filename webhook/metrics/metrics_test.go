package metrics

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/runwarden/runwarden/webhook/policy"
)

// A policy that names rules from its input cannot grow the denials metric
// past maxRules label values; malformed names count as "other".
func TestDenialRuleLabelsAreBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg)
	for i := range 1000 {
		r.Violation(fmt.Sprintf("quota-team-%d", i), "deny")
	}
	r.Violation("Not Kebab", "deny")
	r.Violation("quota-team-0", "deny")
	counts := denials(t, reg)
	if len(counts) != maxRules+1 {
		t.Errorf("%d rule label values, want %d and other", len(counts), maxRules)
	}
	if got, want := counts["other"], float64(1000-maxRules+1); got != want {
		t.Errorf("other = %v, want %v", got, want)
	}
	if got := counts["quota-team-0"]; got != 2 {
		t.Errorf("a known rule counts on: quota-team-0 = %v, want 2", got)
	}
}

// Each violation counts under its rule and action; an action that is not
// one counts as "other", so the action label has four values at most.
func TestViolationsCountByAction(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg)
	r.Violation("no-privileged", "deny")
	r.Violation("no-privileged", "warn")
	r.Violation("no-privileged", "dryrun")
	r.Violation("no-privileged", "dryrun")
	r.Violation("allowed-registries", "dryrun")
	r.Violation("allowed-registries", "Audit")
	got := map[[2]string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "runwarden_webhook_denials_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var k [2]string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "rule":
					k[0] = l.GetValue()
				case "action":
					k[1] = l.GetValue()
				}
			}
			got[k] = m.GetCounter().GetValue()
		}
	}
	want := map[[2]string]float64{
		{"no-privileged", "deny"}:        1,
		{"no-privileged", "warn"}:        1,
		{"no-privileged", "dryrun"}:      2,
		{"allowed-registries", "dryrun"}: 1,
		{"allowed-registries", "other"}:  1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("runwarden_webhook_denials_total (-want +got):\n%s", diff)
	}
}

// The decision cache's state is one series at a time: 1 with reason none
// while it is on, 0 with the form that turned it off; a form that is not
// one of policy.CacheOffForms is "other", and no file name is a label.
func TestDecisionCacheReason(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg)
	steps := []struct {
		off  *policy.CacheOff
		want map[string]float64
	}{
		{off: nil, want: map[string]float64{"none": 1}},
		{off: &policy.CacheOff{Form: policy.CacheOffImpureBuiltin, File: "lib/clock.rego", Line: 5}, want: map[string]float64{"impure-builtin": 0}},
		{off: &policy.CacheOff{Form: policy.CacheOffWholeInput, File: "p.rego", Line: 9}, want: map[string]float64{"whole-input": 0}},
		{off: &policy.CacheOff{Form: "p.rego:9", File: "p.rego"}, want: map[string]float64{"other": 0}},
		{off: nil, want: map[string]float64{"none": 1}},
	}
	for i, step := range steps {
		r.DecisionCache(step.off)
		got := map[string]float64{}
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "runwarden_webhook_decision_cache_enabled" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					got[l.GetName()+"="+l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
		want := map[string]float64{}
		for reason, v := range step.want {
			want["reason="+reason] = v
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("step %d: runwarden_webhook_decision_cache_enabled (-want +got):\n%s", i, diff)
		}
	}
}

// denials sums runwarden_webhook_denials_total by rule.
func denials(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "runwarden_webhook_denials_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// The serving certificate's expiry is read from its file at each scrape,
// so a rotated certificate shows at once; NaN while there is none.
func TestCertificateExpiry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg)
	path := filepath.Join(t.TempDir(), "tls.crt")
	if err := r.WatchCertificate(path); err != nil {
		t.Fatal(err)
	}
	expiry := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "runwarden_webhook_certificate_expiry_timestamp_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no certificate expiry metric")
		return 0
	}
	if v := expiry(); !math.IsNaN(v) {
		t.Errorf("expiry %v without a certificate, want NaN", v)
	}
	for _, days := range []int{30, 90} {
		notAfter := time.Now().Add(time.Duration(days) * 24 * time.Hour).Truncate(time.Second)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: notAfter}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		if v := expiry(); v != float64(notAfter.Unix()) {
			t.Errorf("expiry %v, want %d", v, notAfter.Unix())
		}
	}
}

func TestDecisionsBySource(t *testing.T) {
	t.Parallel()
	r := New(prometheus.NewRegistry())
	r.Decision(policy.FromEvaluation)
	r.Decision(policy.FromCache)
	r.Decision(policy.FromCache)
	got := map[string]float64{}
	for _, source := range []policy.Source{policy.FromCache, policy.FromEvaluation} {
		got[string(source)] = testutil.ToFloat64(r.decisions.WithLabelValues(string(source)))
	}
	if want := map[string]float64{"cache": 2, "evaluation": 1}; !maps.Equal(got, want) {
		t.Errorf("decisions by source: %v, want %v", got, want)
	}
}

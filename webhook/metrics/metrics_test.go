package metrics

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A policy that names rules from its input cannot grow the denials metric
// past maxRules label values; malformed names count as "other".
func TestDenialRuleLabelsAreBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg)
	for i := range 1000 {
		r.Denial(fmt.Sprintf("quota-team-%d", i))
	}
	r.Denial("Not Kebab")
	r.Denial("quota-team-0")
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
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The task histograms observe into bounded buckets, the duration by phase
// alone; the last poll is a timestamp.
func TestTaskHistograms(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg, 10)
	r.Started(3 * time.Second)
	r.Ran("Succeeded", 90*time.Second)
	r.Ran("Failed", 5*time.Hour)
	at := time.Unix(1_700_000_000, 0)
	r.Polled(at)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "runwarden_dispatcher_task_queue_wait_seconds", "runwarden_dispatcher_task_duration_seconds":
				h := m.GetHistogram()
				if len(h.GetBucket()) > 12 {
					t.Errorf("%s has %d buckets", mf.GetName(), len(h.GetBucket()))
				}
				got[mf.GetName()] += int(h.GetSampleCount())
			case "runwarden_dispatcher_last_poll_success_timestamp_seconds":
				if m.GetGauge().GetValue() != float64(at.Unix()) {
					t.Errorf("last poll %v", m.GetGauge().GetValue())
				}
			}
		}
	}
	if got["runwarden_dispatcher_task_queue_wait_seconds"] != 1 || got["runwarden_dispatcher_task_duration_seconds"] != 2 {
		t.Errorf("observations %v", got)
	}
}

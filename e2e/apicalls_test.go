//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/e2e-framework/klient"
)

// apiCalls is a reading of the API server's apiserver_request_total for the
// objects the dispatcher reads and writes, keyed "VERB resource[/sub] code".
type apiCalls map[string]float64

// countedCall tells whether a request the API server counted is one a
// task source, or a loop standing in for it, makes: every request on Jobs
// (not their status, which the Job controller writes), RunnerTasks,
// Secrets and ConfigMaps, and the reads of pods and events (the controller
// manager and scheduler write those for every Job, whoever made it).
// Watches are left out: the API server counts one when it ends.
func countedCall(verb, resource, sub string) bool {
	switch {
	case verb == "WATCH":
		return false
	case resource == "jobs":
		return sub == ""
	case resource == "runnertasks", resource == "secrets", resource == "configmaps":
		return true
	case resource == "pods", resource == "events":
		return verb == "GET" || verb == "LIST"
	}
	return false
}

// readAPICalls reads the API server's request counters. Nothing else
// should be using the cluster meanwhile (e2e runs hold a lock), but the
// controller manager, scheduler and kwok do: countedCall leaves out what
// they do for every Job.
func readAPICalls(ctx context.Context, b testing.TB, c klient.Client) apiCalls {
	b.Helper()
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	raw, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatalf("reading the API server's /metrics: %v", err)
	}
	calls := apiCalls{}
	for l := range strings.SplitSeq(string(raw), "\n") {
		rest, ok := strings.CutPrefix(l, "apiserver_request_total{")
		if !ok {
			continue
		}
		labelText, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		labels := map[string]string{}
		for kv := range strings.SplitSeq(labelText, `",`) {
			k, v, _ := strings.Cut(kv, `="`)
			labels[k] = strings.TrimSuffix(v, `"`)
		}
		if !countedCall(labels["verb"], labels["resource"], labels["subresource"]) {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		res := labels["resource"]
		if labels["subresource"] != "" {
			res += "/" + labels["subresource"]
		}
		calls[labels["verb"]+" "+res+" "+labels["code"]] += f
	}
	return calls
}

// reportAPICalls reports the requests made between two readings, per
// task: all of them (api-calls/task) and the conflicts (409s/task), and
// logs each kind.
func reportAPICalls(b *testing.B, before, after apiCalls, tasks int) {
	b.Helper()
	var total, conflicts float64
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(after)) {
		d := after[k] - before[k]
		if d <= 0 {
			continue
		}
		total += d
		if strings.HasSuffix(k, " 409") {
			conflicts += d
		}
		lines = append(lines, fmt.Sprintf("%s: %.0f (%.3f/task)", k, d, d/float64(tasks)))
	}
	b.Logf("API calls for %d tasks:\n%s", tasks, strings.Join(lines, "\n"))
	b.ReportMetric(total/float64(tasks), "api-calls/task")
	b.ReportMetric(conflicts/float64(tasks), "409s/task")
}

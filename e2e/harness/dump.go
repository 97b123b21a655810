package harness

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/yaml"
)

// Dump logs the events, pods and jobs of a namespace, for reading after a
// failed test. Errors listing them are logged, not returned: a dump is
// best-effort and must not hide the failure that caused it.
func Dump(ctx context.Context, t *testing.T, cfg *envconf.Config, namespace string) {
	t.Helper()
	r := cfg.Client().Resources(namespace)

	var events corev1.EventList
	if err := r.List(ctx, &events); err != nil {
		t.Logf("dump %s: listing events: %v", namespace, err)
	} else {
		sort.Slice(events.Items, func(i, j int) bool {
			return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
		})
		var b strings.Builder
		for _, e := range events.Items {
			fmt.Fprintf(&b, "  %s %s %s/%s: %s\n", e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
		}
		t.Logf("dump %s: %d events\n%s", namespace, len(events.Items), b.String())
	}

	var pods corev1.PodList
	if err := r.List(ctx, &pods); err != nil {
		t.Logf("dump %s: listing pods: %v", namespace, err)
	} else {
		for i := range pods.Items {
			logYAML(t, namespace, "pod", pods.Items[i].Name, &pods.Items[i])
		}
	}

	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs); err != nil {
		t.Logf("dump %s: listing jobs: %v", namespace, err)
	} else {
		for i := range jobs.Items {
			logYAML(t, namespace, "job", jobs.Items[i].Name, &jobs.Items[i])
		}
	}
}

func logYAML(t *testing.T, namespace, kind, name string, obj any) {
	t.Helper()
	b, err := yaml.Marshal(obj)
	if err != nil {
		t.Logf("dump %s: %s %s: %v", namespace, kind, name, err)
		return
	}
	t.Logf("dump %s: %s %s\n%s", namespace, kind, name, b)
}

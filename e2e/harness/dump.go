package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/yaml"
)

// dumpLines bounds the lines a dump logs of each kind (events, pods, Jobs):
// a namespace of 200 tasks would otherwise bury the failure that caused the
// dump under megabytes of its objects. The whole namespace goes to a file.
const dumpLines = 40

// DumpDirEnv names the folder Dump writes each namespace's pods and Jobs
// into, in full (hack/e2e.sh sets it); unset, the system's temporary folder.
const DumpDirEnv = "RUNWARDEN_E2E_DUMPS"

// Dump logs the events, pods and Jobs of a namespace for reading after a
// failed test, a line each and at most dumpLines of each kind, and writes
// the pods and Jobs in full, as YAML, to a file it names. Errors listing
// them are logged, not returned: a dump is best-effort and must not hide the
// failure that caused it.
func Dump(ctx context.Context, t *testing.T, cfg *envconf.Config, namespace string) {
	t.Helper()
	r := cfg.Client().Resources(namespace)
	var full strings.Builder

	var events corev1.EventList
	if err := r.List(ctx, &events); err != nil {
		t.Logf("dump %s: listing events: %v", namespace, err)
	} else {
		sort.SliceStable(events.Items, func(i, j int) bool {
			return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
		})
		lines := make([]string, 0, len(events.Items))
		for _, e := range events.Items {
			lines = append(lines, fmt.Sprintf("%s %s %s/%s: %s", e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message))
		}
		logLast(t, namespace, "events", lines)
	}

	var pods corev1.PodList
	if err := r.List(ctx, &pods); err != nil {
		t.Logf("dump %s: listing pods: %v", namespace, err)
	} else {
		lines := make([]string, 0, len(pods.Items))
		for i := range pods.Items {
			lines = append(lines, describePod(&pods.Items[i]))
			writeYAML(&full, "pod", pods.Items[i].Name, &pods.Items[i])
		}
		logLast(t, namespace, "pods", lines)
	}

	var jobs batchv1.JobList
	if err := r.List(ctx, &jobs); err != nil {
		t.Logf("dump %s: listing jobs: %v", namespace, err)
	} else {
		lines := make([]string, 0, len(jobs.Items))
		for i := range jobs.Items {
			lines = append(lines, describeJob(&jobs.Items[i]))
			writeYAML(&full, "job", jobs.Items[i].Name, &jobs.Items[i])
		}
		logLast(t, namespace, "jobs", lines)
	}

	dir := os.Getenv(DumpDirEnv)
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "runwarden-e2e-dumps")
	}
	path := filepath.Join(dir, namespace+".yaml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("dump %s: %v", namespace, err)
		return
	}
	if err := os.WriteFile(path, []byte(full.String()), 0o644); err != nil {
		t.Logf("dump %s: %v", namespace, err)
		return
	}
	t.Logf("dump %s: its pods and Jobs in full: %s", namespace, path)
}

// logLast logs the last dumpLines of lines, and how many came before.
func logLast(t *testing.T, namespace, kind string, lines []string) {
	t.Helper()
	skipped := max(0, len(lines)-dumpLines)
	var b strings.Builder
	if skipped > 0 {
		fmt.Fprintf(&b, "  (the first %d left out)\n", skipped)
	}
	for _, l := range lines[skipped:] {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	t.Logf("dump %s: %d %s\n%s", namespace, len(lines), kind, b.String())
}

// describePod is what a dump says of a pod in a line.
func describePod(p *corev1.Pod) string {
	owner := "no owner"
	for _, o := range p.OwnerReferences {
		if ptr.Deref(o.Controller, false) {
			owner = o.Kind + " " + o.Name
		}
	}
	var exits []string
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Terminated != nil {
			exits = append(exits, fmt.Sprintf("%s exit %d", s.Name, s.State.Terminated.ExitCode))
		}
	}
	s := fmt.Sprintf("%s (%s, node %q, %s, exits %v", p.Name, p.Status.Phase, p.Spec.NodeName, owner, exits)
	if p.DeletionTimestamp != nil {
		s += ", deleting since " + p.DeletionTimestamp.Format("15:04:05")
	}
	return s + ")"
}

func writeYAML(b *strings.Builder, kind, name string, obj any) {
	out, err := yaml.Marshal(obj)
	if err != nil {
		fmt.Fprintf(b, "# %s %s: %v\n", kind, name, err)
		return
	}
	fmt.Fprintf(b, "---\n# %s %s\n%s", kind, name, out)
}

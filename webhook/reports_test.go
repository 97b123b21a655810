package main

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/policies"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/audit"
	"github.com/runwarden/runwarden/webhook/policy"
)

// appliedReports records the reports a writer applies.
type appliedReports struct {
	mu      sync.Mutex
	reports []audit.Report
	owners  []string
	// applied gets a signal after each report is recorded.
	applied chan struct{}
}

func (a *appliedReports) apply(_ context.Context, _ client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var r audit.Report
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	o := &client.ApplyOptions{}
	o.ApplyOptions(opts)
	a.mu.Lock()
	a.reports = append(a.reports, r)
	a.owners = append(a.owners, o.FieldManager)
	a.mu.Unlock()
	a.applied <- struct{}{}
	return nil
}

func (a *appliedReports) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.reports)
}

// TestReportWriter checks the writer's wiring: it lists the runner
// namespace's Jobs and pods, admits them with the set in force, and applies
// the report as its field manager, at once and then every interval of its
// clock. The report's content is TestBuildReport's.
func TestReportWriter(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "shipped", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "task-1", Namespace: "runners", UID: "uid-1",
			Labels: map[string]string{contract.LabelDispatcher: "rw"}, CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{contract.LabelRunner: "true"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "main", Image: "runner:1", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			}}},
		}},
	}
	old := job.DeepCopy()
	old.Name, old.UID, old.CreationTimestamp = "task-0", "uid-0", metav1.NewTime(now.Add(-48*time.Hour))
	applied := &appliedReports{applied: make(chan struct{}, 4)}
	cl := fake.NewClientBuilder().WithObjects(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "runners"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "runners"}},
		job, old,
	).WithInterceptorFuncs(interceptor.Funcs{Apply: applied.apply}).Build()
	clk := clocktesting.NewFakeClock(now)
	w := &reportWriter{
		reader: cl, writer: cl, policies: staticSet{set}, namespace: "runners",
		evaluator: func(s *policy.Set) *audit.Evaluator {
			return audit.NewEvaluator(audit.Options{Set: s, Lookups: rwadmission.ClusterLookups(cl, nil)})
		},
		since: 24 * time.Hour, maxResults: 100, interval: time.Minute, clock: clk,
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	waitApplied := func(n int) {
		t.Helper()
		select {
		case <-applied.applied:
		case <-time.After(30 * time.Second):
			t.Fatalf("report %d not applied within 30 s", n)
		}
		if got := applied.count(); got != n {
			t.Fatalf("%d reports applied, want %d", got, n)
		}
	}
	waitApplied(1)
	clk.Step(time.Minute)
	waitApplied(2)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
	r := applied.reports[0]
	if r.Metadata.Name != "runwarden" || r.Metadata.Namespace != "runners" || applied.owners[0] != reportFieldOwner {
		t.Errorf("applied %s/%s as %q, want runners/runwarden as %s", r.Metadata.Namespace, r.Metadata.Name, applied.owners[0], reportFieldOwner)
	}
	var fails []string
	for _, res := range r.Results {
		if res.Resources[0].Name != "task-1" {
			t.Errorf("result for %s: only task-1 was created in the last 24h", res.Resources[0].Name)
		}
		if res.Result == audit.ResultFail {
			fails = append(fails, res.Rule)
		}
	}
	if diff := cmp.Diff([]string{"no-privileged"}, fails); diff != "" {
		t.Errorf("failed rules (-want +got):\n%s", diff)
	}
	if len(r.Results) != len(set.Rules()) {
		t.Errorf("%d results, want one per rule (%d)", len(r.Results), len(set.Rules()))
	}
}

package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"gomodules.xyz/jsonpatch/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/policies"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/policy"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// runnerJob is a Job as the dispatcher makes it, created at t0+minutes.
func runnerJob(ns, name string, minutes int, mod func(*corev1.PodSpec, map[string]string)) batchv1.Job {
	labels := map[string]string{contract.LabelRunner: "true"}
	spec := corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Containers:    []corev1.Container{{Name: "main", Image: "registry.example.com/runner:1.0"}},
	}
	if mod != nil {
		mod(&spec, labels)
	}
	return batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, UID: types.UID("uid-" + name),
			Labels:            map[string]string{contract.LabelDispatcher: "runwarden"},
			CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(minutes) * time.Minute)),
		},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}},
	}
}

// podOf is a pod the Job controller made for j, as admitted.
func podOf(j batchv1.Job, suffix string, minutes int) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: j.Name + "-" + suffix, Namespace: j.Namespace, UID: types.UID("pod-" + j.Name + suffix),
			Labels: j.Spec.Template.Labels, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(minutes) * time.Minute)),
			Annotations: map[string]string{
				contract.AnnotationPolicyDigest: "abc", contract.AnnotationSpecDigest: "sha256:0",
				contract.AnnotationMutations: "node selector", "kept": "yes",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}},
		},
		Spec: *j.Spec.Template.Spec.DeepCopy(),
	}
}

// TestSubjects checks the reconstruction: a Job's template as the Job
// controller submits it, named by its newest pod; a pod whose Job is gone
// as admitted without the record; newest first, capped.
func TestSubjects(t *testing.T) {
	t.Parallel()
	kept := runnerJob("team-a", "kept", 10, nil)
	lone := runnerJob("team-a", "lone", 20, nil)
	gone := runnerJob("team-a", "gone", 0, nil)
	other := runnerJob("team-a", "other", 30, nil)
	other.Spec.Template.Labels = map[string]string{"app": "x"} // not a runner Job
	goneP := podOf(gone, "a", 1)
	goneP.Spec.NodeName = "node-1"
	pods := []corev1.Pod{podOf(kept, "old", 11), podOf(kept, "new", 15), goneP}

	got := Subjects([]batchv1.Job{kept, lone, other}, pods, 0)
	refs := make([]string, len(got))
	for i, s := range got {
		refs[i] = s.Ref.String() + " " + s.Source
	}
	want := []string{"job/lone " + SourceJobTemplate, "pod/kept-new " + SourceJobTemplate, "pod/gone-a " + SourceAdmittedPod}
	if diff := cmp.Diff(want, refs); diff != "" {
		t.Fatalf("subjects (-want +got):\n%s", diff)
	}
	wantPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "kept-", Namespace: "team-a", Labels: map[string]string{contract.LabelRunner: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "kept", UID: "uid-kept", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: kept.Spec.Template.Spec,
	}
	if diff := cmp.Diff(wantPod, got[1].Pod); diff != "" {
		t.Errorf("pod rebuilt from the Job (-want +got):\n%s", diff)
	}
	if got[1].JobObject == nil || got[1].JobObject.UID != kept.UID {
		t.Errorf("the subject of Job kept does not carry its Job: %v", got[1].JobObject)
	}
	if diff := cmp.Diff(map[string]string{"kept": "yes"}, got[2].Pod.Annotations); diff != "" {
		t.Errorf("annotations of the pod whose Job is gone (-want +got), the record must be left out:\n%s", diff)
	}
	if got[2].Pod.Spec.NodeName != "" || got[2].Pod.UID != "" {
		t.Errorf("the admitted pod keeps what no request carries: node %q uid %q", got[2].Pod.Spec.NodeName, got[2].Pod.UID)
	}
	if capped := Subjects([]batchv1.Job{kept, lone}, pods, 2); len(capped) != 2 || capped[1].Ref.Name != "kept-new" {
		t.Errorf("capped at 2: %v, want the 2 newest", capped)
	}
}

// loadSets loads the shipped set and a candidate: the shipped set and
// testdata/candidate.rego.
func loadSets(t testing.TB) (current, candidate *policy.Set) {
	t.Helper()
	current, err := policy.Load(t.Context(), policies.FS, "shipped", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	extra, err := os.ReadFile(filepath.Join("testdata", "candidate.rego"))
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{"candidate.rego": {Data: extra}}
	names, err := policies.FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range names {
		b, err := policies.FS.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		fsys[e.Name()] = &fstest.MapFile{Data: b}
	}
	candidate, err = policy.Load(t.Context(), fsys, "candidate", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return current, candidate
}

// clusterOf are lookups of a namespace and service account that exist.
type clusterOf struct{}

func (clusterOf) Namespace(_ context.Context, name string) (*corev1.Namespace, error) {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
}

func (clusterOf) ServiceAccount(_ context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, nil
}

func (clusterOf) ConfigMap(context.Context, string, string) (*corev1.ConfigMap, error) {
	return nil, rwadmission.ErrNotChecked
}

func (clusterOf) Job(context.Context, string, string) (*batchv1.Job, error) {
	return nil, fmt.Errorf("the audit reads its subjects' own Jobs")
}

var scheduling = map[string]any{"scheduling": map[string]any{"nodeSelector": map[string]any{"runwarden.dev/pool": "runner"}}}

// TestCompare admits pods with the shipped set and the candidate and
// checks each change: denied anew, mutated differently, unchanged, denied
// by both, denied by the webhook's own check; and the per-rule view.
func TestCompare(t *testing.T) {
	t.Parallel()
	current, candidate := loadSets(t)
	debug := func(s *corev1.PodSpec, _ map[string]string) {
		s.Containers[0].Env = []corev1.EnvVar{{Name: "DEBUG", Value: "1"}}
	}
	blue := func(_ *corev1.PodSpec, l map[string]string) { l["team"] = "blue" }
	privileged := func(s *corev1.PodSpec, _ map[string]string) {
		s.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	forged := runnerJob("team-a", "forged", 5, nil)
	forged.Labels = nil // not the dispatcher's: the earned check denies it
	jobs := []batchv1.Job{
		runnerJob("team-a", "debug", 1, debug), runnerJob("team-a", "blue", 2, blue),
		runnerJob("team-a", "plain", 3, nil), runnerJob("team-b", "privileged", 4, privileged), forged,
	}
	opts := func(s *policy.Set) Options { return Options{Set: s, Config: scheduling, Lookups: clusterOf{}} }
	diffs, err := CompareAll(t.Context(), NewEvaluator(opts(current)), NewEvaluator(opts(candidate)), Subjects(jobs, nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	c := NewComparison("current", "candidate", diffs)
	got := map[string]Change{}
	for _, d := range c.Diffs {
		got[d.Subject.Ref.Namespace+"/"+d.Subject.Ref.Name] = d.Change
	}
	want := map[string]Change{
		"team-a/debug": NewlyDenied, "team-a/blue": MutatedDifferently, "team-a/plain": Unchanged,
		"team-b/privileged": Unchanged, "team-a/forged": Unchanged,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("changes (-want +got):\n%s", diff)
	}
	if n := c.NewDenials(); n != 1 {
		t.Errorf("NewDenials = %d, want 1", n)
	}
	for _, d := range c.Diffs {
		switch d.Subject.Ref.Name {
		case "debug":
			if diff := cmp.Diff([]Finding{{Rule: "no-debug-env", Container: "main", Field: "env DEBUG", Message: "no-debug-env: DEBUG is set; remove it"}}, d.Added[ListDeny]); diff != "" {
				t.Errorf("debug: added denials (-want +got):\n%s", diff)
			}
		case "blue":
			if diff := cmp.Diff([]string{`add /metadata/annotations {"runwarden.dev/cost-center":"blue"}`}, formatOps(d.PatchAdded)); diff != "" {
				t.Errorf("blue: patch only the candidate makes (-want +got):\n%s", diff)
			}
			if len(d.PatchRemoved) != 0 {
				t.Errorf("blue: patch only the current set makes: %v, want none", formatOps(d.PatchRemoved))
			}
		case "privileged":
			if !d.Current.Denied || d.Current.Findings[ListDeny][0].Rule != "no-privileged" {
				t.Errorf("privileged: current outcome %+v, want denied by no-privileged", d.Current)
			}
		case "forged":
			if !d.Current.Denied || d.Current.Evaluated || d.Current.Findings[ListDeny][0].Rule != RuleAdmission {
				t.Errorf("forged: current outcome %+v, want denied by the webhook's own check, before the policies", d.Current)
			}
		}
	}
	wantRules := []RuleChange{{Rule: "no-debug-env", List: ListDeny, Added: []Ref{{Kind: "Job", Namespace: "team-a", Name: "debug", UID: "uid-debug"}}}}
	if diff := cmp.Diff(wantRules, c.Rules); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
}

func formatOps(ops []jsonpatch.Operation) []string {
	out := make([]string, len(ops))
	for i, op := range ops {
		out[i] = FormatOp(op)
	}
	return out
}

// TestCompareChanges checks how each pair of outcomes is classified.
func TestCompareChanges(t *testing.T) {
	t.Parallel()
	deny := func(rule, msg string) Outcome {
		return Outcome{Denied: true, Evaluated: true, Denial: msg, Findings: map[string][]Finding{ListDeny: {{Rule: rule, Message: msg}}}}
	}
	admit := func(ops ...jsonpatch.Operation) Outcome {
		return Outcome{Evaluated: true, Patch: ops, Findings: map[string][]Finding{}}
	}
	warn := func(w string) Outcome {
		return Outcome{Evaluated: true, Findings: map[string][]Finding{ListWarnings: {{Rule: RuleWarning, Message: w}}}}
	}
	dryrun := func(rule, msg string) Outcome {
		return Outcome{Evaluated: true, Findings: map[string][]Finding{ListDryrun: {{Rule: rule, Message: msg}}}}
	}
	op := func(v string) jsonpatch.Operation {
		return jsonpatch.Operation{Operation: "add", Path: "/metadata/labels/x", Value: v}
	}
	tests := []struct {
		name               string
		current, candidate Outcome
		want               Change
	}{
		{name: "admitted, now denied", current: admit(), candidate: deny("r", "r: no"), want: NewlyDenied},
		{name: "denied, now admitted", current: deny("r", "r: no"), candidate: admit(), want: NoLongerDenied},
		{name: "denied by another rule", current: deny("r", "r: no"), candidate: deny("s", "s: no"), want: DeniedDifferently},
		{name: "denied alike", current: deny("r", "r: no"), candidate: deny("r", "r: no"), want: Unchanged},
		{name: "another label value", current: admit(op("a")), candidate: admit(op("b")), want: MutatedDifferently},
		{name: "a label more", current: admit(), candidate: admit(op("a")), want: MutatedDifferently},
		{name: "same patch", current: admit(op("a")), candidate: admit(op("a")), want: Unchanged},
		{name: "a warning more", current: admit(), candidate: warn("w"), want: WarnedDifferently},
		{name: "a rule put in dryrun", current: admit(), candidate: dryrun("r", "r: no"), want: WarnedDifferently},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Compare(Subject{}, tt.current, tt.candidate).Change; got != tt.want {
				t.Errorf("Change = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestBuildReport checks a report's results, its cap and that no env
// value reaches a message.
func TestBuildReport(t *testing.T) {
	t.Parallel()
	current, _ := loadSets(t)
	// The registry rule quotes the image, which holds the env value.
	cfg := map[string]any{"shape": map[string]any{"allowedRegistries": []any{"registry.example.com"}}}
	ev := NewEvaluator(Options{Set: current, Config: cfg, Lookups: clusterOf{}})
	const secret = "hunter2-token-value"
	leaky := func(s *corev1.PodSpec, _ map[string]string) {
		s.Containers[0].Image = "docker.io/" + secret
		s.Containers[0].Env = []corev1.EnvVar{{Name: "TOKEN", Value: secret}}
		s.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	var jobs []batchv1.Job
	for i := range 5 {
		jobs = append(jobs, runnerJob("team-a", fmt.Sprintf("plain-%d", i), i, nil))
	}
	jobs = append(jobs, runnerJob("team-a", "leaky", 10, leaky))
	var pods []Evaluated
	for _, s := range Subjects(jobs, nil, 0) {
		o, err := ev.Evaluate(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, Evaluated{Subject: s, Outcome: o})
	}
	rules := ev.Rules()
	t.Run("results per rule", func(t *testing.T) {
		t.Parallel()
		r := BuildReport("team-a", pods, ReportOptions{Set: current, Rules: rules, Now: t0})
		if got, want := len(r.Results), 6*len(rules); got != want {
			t.Fatalf("%d results, want %d (6 pods, %d rules)", got, want, len(rules))
		}
		var fails []string
		for _, res := range r.Results {
			if strings.Contains(res.Message, secret) {
				t.Errorf("result %s/%s carries the env value: %q", res.Resources[0].Name, res.Rule, res.Message)
			}
			if res.Result == ResultFail {
				fails = append(fails, res.Resources[0].Name+" "+res.Rule)
			}
			if res.Rule == "allowed-registries" && res.Result == ResultFail && !strings.Contains(res.Message, "docker.io/[redacted]") {
				t.Errorf("the registry rule's message %q does not show the image with the value redacted", res.Message)
			}
		}
		if diff := cmp.Diff([]string{"leaky allowed-registries", "leaky no-privileged"}, fails); diff != "" {
			t.Errorf("fails (-want +got):\n%s", diff)
		}
		wantSummary := ReportSummary{Pass: 6*len(rules) - 2, Fail: 2}
		if diff := cmp.Diff(wantSummary, r.Summary); diff != "" {
			t.Errorf("summary (-want +got):\n%s", diff)
		}
		if r.Metadata.Annotations["runwarden.dev/policy-digest"] != current.Digest {
			t.Errorf("annotations %v lack the set's digest %s", r.Metadata.Annotations, current.Digest)
		}
	})
	t.Run("a rule in dryrun fails, the pod admitted", func(t *testing.T) {
		t.Parallel()
		dry := NewEvaluator(Options{Set: current, Lookups: clusterOf{}, Config: map[string]any{
			"enforcement": map[string]any{"rules": map[string]any{"no-privileged": "dryrun"}},
		}})
		s := Subjects(jobs[len(jobs)-1:], nil, 0)[0]
		o, err := dry.Evaluate(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if o.Denied || len(o.Findings[ListDryrun]) != 1 || o.Findings[ListDryrun][0].Rule != "no-privileged" {
			t.Fatalf("outcome %+v, want admitted with no-privileged in dryrun", o)
		}
		r := BuildReport("team-a", []Evaluated{{Subject: s, Outcome: o}}, ReportOptions{Set: current, Rules: rules, Now: t0})
		var fails []string
		for _, res := range r.Results {
			if res.Result == ResultFail {
				fails = append(fails, res.Rule)
			}
		}
		if diff := cmp.Diff([]string{"no-privileged"}, fails); diff != "" {
			t.Errorf("fails (-want +got):\n%s", diff)
		}
	})
	t.Run("capped, oldest pods dropped whole", func(t *testing.T) {
		t.Parallel()
		r := BuildReport("team-a", pods, ReportOptions{Rules: rules, MaxResults: 2*len(rules) + 1, Now: t0})
		var names []string
		for _, res := range r.Results {
			if n := res.Resources[0].Name; len(names) == 0 || names[len(names)-1] != n {
				names = append(names, n)
			}
		}
		if diff := cmp.Diff([]string{"leaky", "plain-4"}, names); diff != "" {
			t.Errorf("pods kept (-want +got):\n%s", diff)
		}
		if got := r.Metadata.Annotations[AnnotationPodsOmitted]; got != "4" {
			t.Errorf("pods-omitted = %q, want 4", got)
		}
	})
}

// TestRedact checks that env values leave messages, and references stay.
func TestRedact(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "i", Env: []corev1.EnvVar{{Name: "A", Value: "init-secret"}}}},
		Containers: []corev1.Container{{Name: "main", Env: []corev1.EnvVar{
			{Name: "B", Value: "s3cr3t"}, {Name: "C", Value: "s3cr3t-longer"}, {Name: "D", Value: "on"},
			{Name: "E", Value: "${vault:secret/db.password@team-a}"},
		}}},
	}}
	tests := []struct{ name, msg, want string }{
		{name: "init value", msg: "saw init-secret here", want: "saw [redacted] here"},
		{name: "longest first", msg: "x s3cr3t-longer y s3cr3t", want: "x [redacted] y [redacted]"},
		{name: "short values kept", msg: "turned on", want: "turned on"},
		{name: "references kept", msg: "reference ${vault:secret/db.password@team-a} refused", want: "reference ${vault:secret/db.password@team-a} refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Redact(tt.msg, pod); got != tt.want {
				t.Errorf("Redact(%q) = %q, want %q", tt.msg, got, tt.want)
			}
		})
	}
}

// BenchmarkAudit compares the shipped set and the candidate on 1,000
// recorded runner pods (Jobs of 50 shapes: env, labels, privileged or not,
// in 10 namespaces), as `policy audit` does: both sets admit each pod
// through both webhooks, then the outcomes are compared.
func BenchmarkAudit(b *testing.B) {
	current, candidate := loadSets(b)
	var jobs []batchv1.Job
	for i := range 1000 {
		jobs = append(jobs, runnerJob(fmt.Sprintf("team-%d", i%10), fmt.Sprintf("task-%d", i), i, func(s *corev1.PodSpec, l map[string]string) {
			s.Containers[0].Env = []corev1.EnvVar{{Name: "STEP", Value: fmt.Sprint(i % 50)}}
			if i%50 == 7 {
				s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "DEBUG", Value: "1"})
			}
			if i%50 == 13 {
				s.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
			}
			if i%2 == 0 {
				l["team"] = "blue"
			}
		}))
	}
	subjects := Subjects(jobs, nil, 0)
	opts := func(s *policy.Set) Options { return Options{Set: s, Config: scheduling, Lookups: clusterOf{}} }
	for b.Loop() {
		diffs, err := CompareAll(b.Context(), NewEvaluator(opts(current)), NewEvaluator(opts(candidate)), subjects)
		if err != nil {
			b.Fatal(err)
		}
		if c := NewComparison("current", "candidate", diffs); c.NewDenials() != 20 {
			b.Fatalf("%d new denials, want 20", c.NewDenials())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "µs/pod")
}

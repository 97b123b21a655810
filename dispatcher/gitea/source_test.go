package gitea

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/contract"
)

func recordJob(id int64, value string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name:        job.Name(taskID(id)),
		Annotations: map[string]string{contract.TaskID: taskID(id), AnnotationTask: value},
	}}
}

func TestReadRecord(t *testing.T) {
	want := record{Task: 42, Steps: 3, Marker: "::runwarden-abc::"}
	j := recordJob(42, "")
	want.annotate(j)
	got, err := readRecord(j)
	if err != nil || got != want {
		t.Fatalf("readRecord = %+v, %v; want %+v", got, err, want)
	}
	moved := recordJob(42, "")
	moved.Annotations[AnnotationTask] = "43/3/::runwarden-abc::"
	for name, j := range map[string]*batchv1.Job{
		"another task's record":  moved,
		"no record":              recordJob(42, ""),
		"a bad marker":           recordJob(42, "42/3/abc"),
		"too many steps":         recordJob(42, "42/1001/::runwarden-abc::"),
		"negative steps":         recordJob(42, "42/-1/::runwarden-abc::"),
		"a task ID that is none": recordJob(42, "x/3/::runwarden-abc::"),
	} {
		if _, err := readRecord(j); err == nil {
			t.Errorf("%s: believed", name)
		}
	}
}

func TestReadLines(t *testing.T) {
	long := strings.Repeat("x", maxRow+100)
	in := "one\n" + long + "\n\nlast without newline"
	var got []string
	if err := readLines(io.MultiReader(strings.NewReader(in[:10]), strings.NewReader(in[10:])), func(l string) error { got = append(got, l); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0] != "one" || got[1] != long[:maxRow] || got[2] != "" || got[3] != "last without newline" {
		t.Fatalf("lines: %d, first %q, second %d bytes, last %q", len(got), got[0], len(got[1]), got[len(got)-1])
	}
}

func TestSnapshotCountsARunningStepsRows(t *testing.T) {
	l := newStepLog("::m::", 2)
	now := time.Now()
	l.add("before", now)
	l.add(`::m:: {"kind":"start","step":0}`, now)
	l.add("one", now)
	l.add("two", now)
	s := l.snapshot()
	if s[0].LogIndex != 1 || s[0].LogLength != 2 || s[0].Result != runnerv1.Result_RESULT_UNSPECIFIED || s[1].StartedAt != nil {
		t.Fatalf("snapshot = %v", s)
	}
	if l.steps[0].LogLength != 0 {
		t.Fatal("snapshot changed the log's own state")
	}
}

func TestConfigCheck(t *testing.T) {
	base := []string{"--gitea-url=https://gitea.example.com/", "--gitea-labels=tofu, linux", "--gitea-identity-secret=runwarden/gitea-runner", "--gitea-steps-image=dispatcher:1"}
	parse := func(args ...string) (*Config, error) {
		c := &Config{}
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.Bind(fs)
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		return c, c.Check(runner.Shared{DispatcherID: "d", Namespace: "runners"})
	}
	c, err := parse(base...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.parsedLabels, ",") != "tofu,linux" || c.identityKey.String() != "runwarden/gitea-runner" {
		t.Errorf("labels %v, identity %s", c.parsedLabels, c.identityKey)
	}
	c, err = parse(append(base, "--gitea-template=small=runwarden/small", "--gitea-template=tofu=runwarden/tofu")...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.parsedLabels, ",") != "tofu,linux,small" || c.templates["small"].String() != "runwarden/small" {
		t.Errorf("with templates: labels %v, templates %v", c.parsedLabels, c.templates)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{append(base, "--gitea-template=small"), "want LABEL=NAMESPACE/NAME"},
		{append(base, "--gitea-template=small=runwarden/a", "--gitea-template=small=runwarden/b"), "two templates"},
		{append(base, "--gitea-template=a:host=runwarden/a"), "a label is a name"},
		{base[1:], "needs --gitea-url"},
		{[]string{base[0], base[2], base[3]}, "needs --gitea-labels or --gitea-template"},
		{[]string{base[0], base[1], base[3]}, "needs --gitea-identity-secret"},
		{base[:3], "needs --gitea-steps-image"},
		{append(base, "--gitea-identity-secret=runners/gitea-runner"), "not in --namespace runners"},
		{append(base, "--gitea-template=small=runwarden/small", "--gitea-template=large=runners/large"), `--gitea-template "large=runners/large": not in --namespace runners`},
		{append(base, "--gitea-identity-secret=gitea-runner"), "want NAMESPACE/NAME"},
		{append(base, "--gitea-labels=tofu:docker://alpine"), "a label is a name"},
		{append(base, "--gitea-url=ftp://gitea"), "want an http or https URL"},
		{append(base, "--gitea-report-interval=2m"), "between 100ms and 1m"},
		{append(base, "--gitea-fork-pull-requests=yes"), `--gitea-fork-pull-requests "yes": want refuse or run`},
	} {
		if _, err := parse(tt.args...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want %q", tt.args, err, tt.want)
		}
	}
}

func TestJobOptionsOfALabelsTemplate(t *testing.T) {
	pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "runwarden", Name: "large"}, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		// The API server's default for every PodTemplate.
		RestartPolicy: corev1.RestartPolicyAlways,
		Containers:    []corev1.Container{{Name: job.RunnerContainer, Image: "runner:large"}},
	}}}
	c := fake.NewClientBuilder().WithObjects(pt).Build()
	s := New(Options{Kube: c, StepsImage: "dispatcher:1", Labels: []string{"tofu", "large"},
		Templates: map[string]types.NamespacedName{"large": {Namespace: "runwarden", Name: "large"}, "gone": {Namespace: "runwarden", Name: "gone"}},
		Jobs:      job.Options{DispatcherID: "d", Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "runner:default"}}}}}})
	for label, image := range map[string]string{"large": "runner:large", "tofu": "runner:default"} {
		tmpl, err := Template([]string{label}, s.labelTemplates())
		if err != nil {
			t.Fatal(err)
		}
		opts, err := s.jobOptions(t.Context(), tmpl)
		if err != nil {
			t.Fatal(err)
		}
		spec := opts.Template.Spec
		if spec.Containers[0].Image != image || spec.RestartPolicy != "" || len(spec.InitContainers) != 1 || spec.InitContainers[0].Image != "dispatcher:1" {
			t.Errorf("%s: image %s, restartPolicy %q, init containers %v", label, spec.Containers[0].Image, spec.RestartPolicy, spec.InitContainers)
		}
	}
	if _, err := s.jobOptions(t.Context(), "runwarden/gone"); err == nil || !strings.Contains(err.Error(), "the runner template runwarden/gone") {
		t.Errorf("a template that is not there: %v", err)
	}
}

package job

import (
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/internal/contract"
)

var update = flag.Bool("update", false, "rewrite testdata/golden-*.yaml")

func template(t *testing.T) corev1.PodTemplateSpec {
	t.Helper()
	b, err := os.ReadFile("testdata/valid-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tmpl corev1.PodTemplateSpec
	if err := yaml.UnmarshalStrict(b, &tmpl); err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func options(t *testing.T) Options {
	return Options{
		DispatcherID:  "dispatcher-a",
		Template:      template(t),
		EnvAllowList:  []string{"TF_*", "LOG_LEVEL", "DB_*"},
		RepoAllowList: []*regexp.Regexp{regexp.MustCompile(`^https://git\.example\.com/`)},
	}
}

func task() Task {
	return Task{
		ID: "Deploy/Prod#42", Namespace: "team-a",
		Image: "localhost/runwarden/runner:tofu", Command: []string{"tofu"}, Args: []string{"apply", "-auto-approve"},
		Env: []corev1.EnvVar{
			{Name: "LOG_LEVEL", Value: "debug"},
			{Name: "DB_PASSWORD", Value: "${vault:secret/db.password@team-a}"},
		},
		SecretEnv: map[string]string{"TF_VAR_token": "s3cr3t"},
		RepoURL:   "https://git.example.com/team-a/infra.git",
	}
}

func TestBuildGolden(t *testing.T) {
	t.Parallel()
	j, s, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	got, err := yaml.Marshal(map[string]any{"job": j, "secret": s})
	if err != nil {
		t.Fatal(err)
	}
	golden := "testdata/golden-job.yaml"
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("Job differs from %s (-want +got):\n%s", golden, diff)
	}
}

func TestBuildShape(t *testing.T) {
	t.Parallel()
	j, s, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	spec := j.Spec
	if *spec.BackoffLimit != 0 || *spec.PodReplacementPolicy != "Failed" || spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("retries: backoffLimit %d, podReplacementPolicy %s, restartPolicy %s", *spec.BackoffLimit, *spec.PodReplacementPolicy, spec.Template.Spec.RestartPolicy)
	}
	if *spec.ActiveDeadlineSeconds != 3600 || spec.TTLSecondsAfterFinished != nil {
		t.Errorf("deadline %d, ttl %v (want none until the outcome is reported)", *spec.ActiveDeadlineSeconds, spec.TTLSecondsAfterFinished)
	}
	pod := spec.Template
	if pod.Labels[contract.LabelRunner] != "true" || pod.Labels[contract.LabelDispatcher] != "dispatcher-a" || pod.Labels["team"] != "platform" {
		t.Errorf("pod labels %v", pod.Labels)
	}
	if pod.Annotations[AnnotationRepoURL] != "https://git.example.com/team-a/infra.git" || pod.Annotations[contract.TaskID] != "Deploy/Prod#42" {
		t.Errorf("pod annotations %v", pod.Annotations)
	}
	main := pod.Spec.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range main.Env {
		env[e.Name] = e
	}
	if env["LOG_LEVEL"].Value != "debug" || env["TF_IN_AUTOMATION"].Value != "1" {
		t.Errorf("env not merged by name, task winning: %+v", main.Env)
	}
	if env["DB_PASSWORD"].Value != "${vault:secret/db.password@team-a}" {
		t.Errorf("secret reference not passed through: %+v", env["DB_PASSWORD"])
	}
	ref := env["TF_VAR_token"].ValueFrom
	if ref == nil || ref.SecretKeyRef.Name != SecretPrefix+j.Name || ref.SecretKeyRef.Key != "TF_VAR_token" {
		t.Errorf("secret value not referenced by secretKeyRef: %+v", env["TF_VAR_token"])
	}
	if s == nil || s.StringData["TF_VAR_token"] != "s3cr3t" || s.Name != SecretPrefix+j.Name {
		t.Errorf("secret %+v", s)
	}
	if out, _ := yaml.Marshal(j); strings.Contains(string(out), "s3cr3t") {
		t.Error("a task secret value appears literally in the Job")
	}
	if main.Resources.Limits.Memory().String() != "1Gi" || len(pod.Spec.Containers) != 2 {
		t.Errorf("template parts lost: %+v", pod.Spec)
	}
}

func TestName(t *testing.T) {
	t.Parallel()
	ids := []string{"42", "Deploy/Prod#42", strings.Repeat("very-long-task-id-", 10), "---", "UPPER_case.id", ""}
	seen := map[string]string{}
	for _, id := range ids {
		n := Name(id)
		if n != Name(id) {
			t.Errorf("Name(%q) is not deterministic", id)
		}
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 || len(n) > 52 {
			t.Errorf("Name(%q) = %q is not a valid Job name that leaves room for pod names: %v", id, n, errs)
		}
		if other, dup := seen[n]; dup {
			t.Errorf("Name(%q) = Name(%q) = %q", id, other, n)
		}
		seen[n] = id
	}
	if Name("a/b") == Name("a-b") {
		t.Error("IDs that sanitize alike must still get different names")
	}
}

func TestBuildRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mut  func(*Task, *Options)
		is   error
		want string
	}{
		{name: "no id", mut: func(t *Task, _ *Options) { t.ID = "" }, is: ErrInvalidTask},
		{name: "env not allowed", mut: func(t *Task, _ *Options) {
			t.Env = append(t.Env, corev1.EnvVar{Name: "AWS_SECRET_ACCESS_KEY", Value: "x"})
		}, is: ErrEnvNotAllowed, want: "AWS_SECRET_ACCESS_KEY"},
		{name: "secret env not allowed", mut: func(t *Task, _ *Options) { t.SecretEnv["HOME"] = "x" }, is: ErrEnvNotAllowed, want: "HOME"},
		{name: "plain and secret", mut: func(t *Task, _ *Options) { t.SecretEnv["LOG_LEVEL"] = "x" }, is: ErrInvalidTask},
		{name: "plain and the source's", mut: func(t *Task, _ *Options) { t.SourceSecretEnv = map[string]string{"LOG_LEVEL": "x"} }, is: ErrInvalidTask},
		{name: "secret and the source's", mut: func(t *Task, _ *Options) { t.SourceSecretEnv = map[string]string{"TF_VAR_token": "x"} }, is: ErrInvalidTask},
		{name: "repo not allowed", mut: func(t *Task, _ *Options) { t.RepoURL = "https://evil.example.com/x.git" }, is: ErrRepoNotAllowed},
		{name: "no image anywhere", mut: func(t *Task, o *Options) { t.Image = ""; o.Template = corev1.PodTemplateSpec{} }, is: ErrInvalidTask, want: "no image"},
		{name: "deadline from the task", mut: func(t *Task, _ *Options) { t.ActiveDeadlineSeconds = ptr.To[int64](60) }},
		{name: "env from another secret", mut: func(t *Task, _ *Options) {
			t.Env = append(t.Env, corev1.EnvVar{Name: "TF_VAR_key", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}, Key: "aws_secret_access_key",
			}}})
		}, is: ErrEnvSource, want: "(TF_VAR_key): valueFrom.secretKeyRef"},
		{name: "env from a config map", mut: func(t *Task, _ *Options) {
			t.Env = append(t.Env, corev1.EnvVar{Name: "TF_VAR_cm", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "platform"}, Key: "k",
			}}})
		}, is: ErrEnvSource, want: "valueFrom.configMapKeyRef"},
		{name: "env from a file of a mounted volume", mut: func(t *Task, _ *Options) {
			t.Env = append(t.Env, corev1.EnvVar{Name: "TF_VAR_token", ValueFrom: &corev1.EnvVarSource{FileKeyRef: &corev1.FileKeySelector{
				VolumeName: "aws-iam-token", Path: "token", Key: "token",
			}}})
		}, is: ErrEnvSource, want: "valueFrom.fileKeyRef"},
		{name: "env from an unknown source", mut: func(t *Task, _ *Options) {
			t.Env = append(t.Env, corev1.EnvVar{Name: "TF_VAR_x", ValueFrom: &corev1.EnvVarSource{}})
		}, is: ErrEnvSource, want: "an unknown source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tk, o := task(), options(t)
			tt.mut(&tk, &o)
			j, _, err := Build(tk, o)
			if tt.is == nil {
				if err != nil || *j.Spec.ActiveDeadlineSeconds != 60 {
					t.Fatalf("Build: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %v mentioning %q", err, tt.is, tt.want)
			}
		})
	}
}

// TestBuildSourceSecretEnv: a variable the source sets itself goes into the
// task's Secret beside the task's own, without an allow-list entry.
func TestBuildSourceSecretEnv(t *testing.T) {
	t.Parallel()
	tk, o := task(), options(t)
	tk.SourceSecretEnv = map[string]string{"RUNWARDEN_STEPS_PLAN": `{"job":"j"}`}
	j, secret, err := Build(tk, o)
	if err != nil {
		t.Fatal(err)
	}
	if secret.StringData["RUNWARDEN_STEPS_PLAN"] != `{"job":"j"}` || secret.StringData["TF_VAR_token"] != "s3cr3t" {
		t.Errorf("the Secret holds %v", secret.StringData)
	}
	var ref bool
	for _, e := range j.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "RUNWARDEN_STEPS_PLAN" {
			ref = e.Value == "" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == secret.Name
		}
	}
	if !ref {
		t.Errorf("the runner container does not read the source's variable from the task's Secret: %+v", j.Spec.Template.Spec.Containers[0].Env)
	}
}

// TestBuildEnvFromPodFields: fieldRef and resourceFieldRef read only the
// pod's own fields, so a task keeps them.
func TestBuildEnvFromPodFields(t *testing.T) {
	t.Parallel()
	tk, o := task(), options(t)
	tk.Env = append(tk.Env,
		corev1.EnvVar{Name: "TF_VAR_pod", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		corev1.EnvVar{Name: "TF_VAR_mem", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}},
	)
	j, _, err := Build(tk, o)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	got := map[string]bool{}
	for _, e := range runner(&j.Spec.Template.Spec).Env {
		got[e.Name] = e.ValueFrom != nil
	}
	if !got["TF_VAR_pod"] || !got["TF_VAR_mem"] {
		t.Errorf("runner env %v lacks the fieldRef and resourceFieldRef variables", got)
	}
}

func TestValidateTemplate(t *testing.T) {
	t.Parallel()
	good := template(t)
	if err := ValidateTemplate(good); err != nil {
		t.Errorf("valid template refused: %v", err)
	}
	bad := good.DeepCopy()
	bad.Spec.Containers[0].Name = "runner"
	bad.Spec.RestartPolicy = corev1.RestartPolicyAlways
	bad.Labels["runwarden.dev/runner"] = "false"
	err := ValidateTemplate(*bad)
	if !errors.Is(err, ErrInvalidTemplate) {
		t.Fatalf("error %v, want ErrInvalidTemplate", err)
	}
	for _, w := range []string{`no container named "main"`, "spec.restartPolicy", "metadata.labels[runwarden.dev/runner]"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

// HasSecret tells the Jobs whose task has a Secret of its own (named after
// the Job) from those without, one whose template refers to another Secret
// included; it needs no pod template (the dispatcher's cache has none).
func TestHasSecret(t *testing.T) {
	t.Parallel()
	j, secret, err := Build(task(), options(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := SecretPrefix + j.Name; secret == nil || secret.Name != want || j.Annotations[AnnotationSecret] != want {
		t.Fatalf("the task's Secret: %v, annotated %q; want it named %s", secret, j.Annotations[AnnotationSecret], want)
	}
	if !strings.HasPrefix(j.Name, NamePrefix) {
		t.Errorf("Job name %s lacks %s", j.Name, NamePrefix)
	}
	j.Spec.Template = corev1.PodTemplateSpec{}
	if !HasSecret(j) {
		t.Errorf("a task with secret values: Secret %v, HasSecret %v", secret != nil, HasSecret(j))
	}
	plain := task()
	plain.SecretEnv = nil
	o := options(t)
	main := &o.Template.Spec.Containers[0]
	main.Env = append(main.Env, corev1.EnvVar{Name: "OTHER", ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "platform-creds"}, Key: "k"},
	}})
	j, secret, err = Build(plain, o)
	if err != nil {
		t.Fatal(err)
	}
	if secret != nil || HasSecret(j) {
		t.Errorf("a task without secret values: Secret %v, HasSecret %v", secret != nil, HasSecret(j))
	}
}

// Package job turns a task into the one Kubernetes Job that runs it: named
// deterministically from the task ID (a second create is AlreadyExists and
// is adopted, never duplicated), labelled for the task and the dispatcher,
// never retried, bounded in time, with the platform's pod template
// strategic-merged with the task, and the task's secret values moved into a
// Secret the Job references.
package job

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"regexp"
	"sort"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/internal/contract"
)

// Labels and annotations runwarden puts on Jobs and their pods.
const (
	// AnnotationPreflight marks the preflight's throwaway Job: no source
	// takes it for a task's.
	AnnotationPreflight = "runwarden.dev/preflight"
	// AnnotationRepoURL is the task's git repository.
	AnnotationRepoURL = "runwarden.dev/repo-url"
	// AnnotationReported marks a finished Job whose outcome the source
	// holds (the RunnerTask's status, or the orchestrator's acknowledged
	// final event). Only then does the Job get its TTL, and only marked
	// Jobs count towards the history limits, so no outcome is ever lost to
	// a deletion.
	AnnotationReported = "runwarden.dev/reported"
	// AnnotationKeepUntil (RFC 3339) keeps a reported Job until then,
	// whatever the history limits: the Job is the record that its task
	// ended, which a late delivery of the task's lease is checked against
	// (see docs/dispatcher.md, Replicas).
	AnnotationKeepUntil = "runwarden.dev/keep-until"
	// AnnotationSecret marks a Job whose task has a Secret of its own, and
	// names it (SecretName of the Job's name). The dispatcher's cache holds
	// Jobs without their pod template, where the Secret is referred to.
	AnnotationSecret = "runwarden.dev/secret"
	// NamePrefix begins every Job name the dispatcher makes (Name). The
	// chart's admission policy refuses the dispatcher's Jobs without it.
	NamePrefix = "rw-"
	// SecretPrefix begins the name of every task's Secret: SecretName of
	// its Job's name. The chart's admission policy lets a Job of the
	// dispatcher name no Secret of its own but SecretPrefix plus its own
	// name, and the dispatcher make no Secret but such one, and refuses
	// the platform Secret names that begin with it: naming a Job after a
	// platform Secret (vault-token) reads nothing of the platform's.
	SecretPrefix = "rw-secret-"
	// RunnerContainer is the name of the runner container.
	RunnerContainer = "main"
)

// Errors a caller can check with errors.Is; each is wrapped with the detail.
var (
	ErrInvalidTask     = errors.New("invalid task")
	ErrInvalidTemplate = errors.New("invalid pod template")
	ErrEnvNotAllowed   = errors.New("env variable not on the forwarding allow-list")
	ErrRepoNotAllowed  = errors.New("repository URL not on the allow-list")
	// ErrEnvSource is a task variable that would read something of the
	// cluster's (a Secret, a ConfigMap, a file of a volume the platform
	// mounts) rather than carry a value: task input is data, never a key.
	ErrEnvSource        = errors.New("env source not allowed in a task")
	errSecretCollisions = errors.New("a variable is both plain and secret")
)

// Task is one unit of work, whatever its source.
type Task struct {
	// ID identifies the task at its source. Required.
	ID string
	// Namespace the Job runs in. Required.
	Namespace string
	// Image of the runner container. Default: the template's.
	Image string
	// Command and Args of the runner container. Default: the template's.
	Command, Args []string
	// Env of the runner container: plain values, or valueFrom.fieldRef or
	// resourceFieldRef (the pod's own fields); any other source is refused
	// (ErrEnvSource). Secret references (${vault:...} and the like) pass
	// through untouched for the webhook and the runner.
	Env []corev1.EnvVar
	// SecretEnv are variables whose values must not appear in the Job: they
	// go into the task's Secret and are referenced by secretKeyRef.
	SecretEnv map[string]string
	// SourceSecretEnv are secret variables the task's source sets itself,
	// under names of runwarden's code (the Gitea source's job plan), not the
	// task's origin: they go into the task's Secret as SecretEnv does, but
	// are not held to Options.EnvAllowList, which is for the names a task
	// chooses.
	SourceSecretEnv map[string]string
	// RepoURL is the task's git repository, if any.
	RepoURL string
	// Resources of the runner container. Default: the template's.
	Resources *corev1.ResourceRequirements
	// ActiveDeadlineSeconds bounds the run. Default: Options.DefaultDeadline.
	ActiveDeadlineSeconds *int64
	// Queue is the Kueue LocalQueue the task waits in (with
	// Options.Queueing.Kueue). Default: Queueing.DefaultQueue.
	Queue string
	// PriorityClass orders waiting tasks: a WorkloadPriorityClass with
	// Kueue, else one of Queueing.Priorities. Default:
	// Queueing.DefaultPriorityClass.
	PriorityClass string
}

// Options say how Jobs are built.
type Options struct {
	// DispatcherID names this dispatcher on its Jobs. Required.
	DispatcherID string
	// Template is the platform's pod template. It must have a container
	// named "main". Default: a "main" container with no image, which every
	// task must then give.
	Template corev1.PodTemplateSpec
	// DefaultDeadline is activeDeadlineSeconds for tasks without one.
	// Default: 3600.
	DefaultDeadline int64
	// TTLSecondsAfterFinished removes finished Jobs once their outcome is
	// reported (MarkReported sets it; Build leaves it out). Default: 86400.
	TTLSecondsAfterFinished int32
	// EnvAllowList are glob patterns (path.Match) of the env variable names a
	// task may set; a task with another variable is refused. Default: none
	// allowed.
	EnvAllowList []string
	// RepoAllowList are regular expressions; a task's RepoURL must match one.
	// Default: any repository.
	RepoAllowList []*regexp.Regexp
	// Queueing says how tasks wait for a slot: through Kueue, or the
	// dispatcher's own slots. Default: the dispatcher's own.
	Queueing Queueing
	// Templates, when set, gives the template in force at each Build (a
	// watched PodTemplate object), instead of Template.
	Templates func() corev1.PodTemplateSpec
}

func (o *Options) setDefaults() {
	if o.DefaultDeadline <= 0 {
		o.DefaultDeadline = 3600
	}
	if o.TTLSecondsAfterFinished <= 0 {
		o.TTLSecondsAfterFinished = 86400
	}
	if len(o.Template.Spec.Containers) == 0 {
		o.Template.Spec.Containers = []corev1.Container{{Name: RunnerContainer}}
	}
}

// TemplateOf is the runner template a PodTemplate object holds, with what
// the API server defaults in every PodTemplate and Build sets anyway
// cleared: restartPolicy (Always there; runner pods never restart, Build
// makes it Never).
func TemplateOf(pt *corev1.PodTemplate) corev1.PodTemplateSpec {
	t := *pt.Template.DeepCopy()
	t.Spec.RestartPolicy = ""
	return t
}

// ValidateTemplate checks the platform's pod template once, at start.
func ValidateTemplate(t corev1.PodTemplateSpec) error {
	var problems []string
	found := false
	for _, c := range t.Spec.Containers {
		if c.Name == RunnerContainer {
			found = true
		}
	}
	if !found && len(t.Spec.Containers) > 0 {
		problems = append(problems, fmt.Sprintf("spec.containers: no container named %q (the runner container)", RunnerContainer))
	}
	switch t.Spec.RestartPolicy {
	case "", corev1.RestartPolicyNever:
	default:
		problems = append(problems, fmt.Sprintf("spec.restartPolicy: %q; runner pods never restart (leave it empty or Never)", t.Spec.RestartPolicy))
	}
	for k := range t.Labels {
		if strings.HasPrefix(k, contract.Prefix) {
			problems = append(problems, fmt.Sprintf("metadata.labels[%s]: runwarden.dev/ labels are set by the dispatcher", k))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("%w: %s", ErrInvalidTemplate, strings.Join(problems, "; "))
	}
	return nil
}

// Name is the Job name of a task: readable, valid, and the same for the same
// ID every time, so a second create of the same task is AlreadyExists.
func Name(taskID string) string {
	sum := sha256.Sum256([]byte(taskID))
	suffix := hex.EncodeToString(sum[:])[:10]
	base := strings.Trim(invalidName.ReplaceAllString(strings.ToLower(taskID), "-"), "-")
	// Pods of the Job get its name plus "-" and 5 characters; keep room.
	if max := 52 - len("rw--") - len(suffix); len(base) > max {
		base = strings.TrimRight(base[:max], "-")
	}
	if base == "" {
		return NamePrefix + suffix
	}
	return NamePrefix + base + "-" + suffix
}

// SecretName is the name of the Secret of the task whose Job is named
// jobName: SecretPrefix and the Job's name, so it never equals a Secret of
// the platform's (whose names the chart keeps from SecretPrefix).
func SecretName(jobName string) string {
	return SecretPrefix + jobName
}

var invalidName = regexp.MustCompile(`[^a-z0-9-]+`)

// taskLabel is the task ID when it is a valid label value, else its hash.
func taskLabel(id string) string {
	if len(validation.IsValidLabelValue(id)) == 0 {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256-" + hex.EncodeToString(sum[:])[:40]
}

// Build returns the Job for a task and, when the task has secret values,
// the Secret they go into (SecretName of the Job's name; the caller makes
// the Job its owner once the Job exists).
func Build(t Task, o Options) (*batchv1.Job, *corev1.Secret, error) {
	if o.Templates != nil {
		o.Template = o.Templates()
	}
	o.setDefaults()
	if t.ID == "" || t.Namespace == "" {
		return nil, nil, fmt.Errorf("%w: a task needs an ID and a namespace", ErrInvalidTask)
	}
	if o.DispatcherID == "" {
		return nil, nil, fmt.Errorf("%w: no dispatcher ID", ErrInvalidTask)
	}
	if err := checkEnv(t, o.EnvAllowList); err != nil {
		return nil, nil, err
	}
	if t.RepoURL != "" && len(o.RepoAllowList) > 0 && !matchesAny(o.RepoAllowList, t.RepoURL) {
		return nil, nil, fmt.Errorf("%w: %s", ErrRepoNotAllowed, t.RepoURL)
	}
	name := Name(t.ID)

	pod, err := mergeTemplate(o.Template, t)
	if err != nil {
		return nil, nil, err
	}
	main := runner(&pod.Spec)
	if main == nil || main.Image == "" {
		return nil, nil, fmt.Errorf("%w: task %s has no image and the template's %q container has none", ErrInvalidTask, t.ID, RunnerContainer)
	}
	labels := map[string]string{
		contract.LabelRunner:     "true",
		contract.TaskID:          taskLabel(t.ID),
		contract.LabelDispatcher: o.DispatcherID,
	}
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	for k, v := range labels {
		pod.Labels[k] = v
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[contract.TaskID] = t.ID
	if t.RepoURL != "" {
		pod.Annotations[AnnotationRepoURL] = t.RepoURL
	}
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever

	secretEnv := t.SecretEnv
	if len(t.SourceSecretEnv) > 0 {
		secretEnv = maps.Clone(t.SecretEnv)
		if secretEnv == nil {
			secretEnv = map[string]string{}
		}
		maps.Copy(secretEnv, t.SourceSecretEnv)
	}
	var secret *corev1.Secret
	if len(secretEnv) > 0 {
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: SecretName(name), Namespace: t.Namespace, Labels: map[string]string{contract.TaskID: labels[contract.TaskID], contract.LabelDispatcher: o.DispatcherID}},
			Type:       corev1.SecretTypeOpaque,
			StringData: map[string]string{},
		}
		for _, k := range sortedKeys(secretEnv) {
			secret.StringData[k] = secretEnv[k]
			setEnv(main, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: secret.Name}, Key: k,
			}}})
		}
	}

	deadline := o.DefaultDeadline
	if t.ActiveDeadlineSeconds != nil {
		deadline = *t.ActiveDeadlineSeconds
	}
	j := &batchv1.Job{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: t.Namespace,
			Labels:      map[string]string{contract.TaskID: labels[contract.TaskID], contract.LabelDispatcher: o.DispatcherID},
			Annotations: map[string]string{contract.TaskID: t.ID},
		},
		Spec: batchv1.JobSpec{
			BackoffLimit:          ptr.To[int32](0),
			PodReplacementPolicy:  ptr.To(batchv1.Failed),
			ActiveDeadlineSeconds: ptr.To(deadline),
			// No TTL until the outcome is reported (MarkReported): a
			// dispatcher down for longer than the TTL must not find the
			// Job gone, its outcome unknown.
			Template: pod,
		},
	}
	if secret != nil {
		j.Annotations[AnnotationSecret] = secret.Name
	}
	j.Annotations[AnnotationTemplateDigest] = templateDigest(o.Template)
	if err := o.Queueing.queueJob(j, t); err != nil {
		return nil, nil, err
	}
	return j, secret, nil
}

// mergeTemplate strategic-merges the task into the platform's template:
// the task's image, command, args and env win for the runner container,
// env merged by name.
func mergeTemplate(tmpl corev1.PodTemplateSpec, t Task) (corev1.PodTemplateSpec, error) {
	base, err := json.Marshal(tmpl)
	if err != nil {
		return tmpl, fmt.Errorf("%w: %w", ErrInvalidTemplate, err)
	}
	c := map[string]any{"name": RunnerContainer}
	if t.Image != "" {
		c["image"] = t.Image
	}
	if len(t.Command) > 0 {
		c["command"] = t.Command
	}
	if len(t.Args) > 0 {
		c["args"] = t.Args
	}
	if len(t.Env) > 0 {
		c["env"] = t.Env
	}
	if t.Resources != nil {
		c["resources"] = t.Resources
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"containers": []any{c}}})
	if err != nil {
		return tmpl, fmt.Errorf("%w: %w", ErrInvalidTask, err)
	}
	merged, err := strategicpatch.StrategicMergePatch(base, patch, corev1.PodTemplateSpec{})
	if err != nil {
		return tmpl, fmt.Errorf("%w: merging task %s into the template: %w", ErrInvalidTask, t.ID, err)
	}
	var out corev1.PodTemplateSpec
	if err := json.Unmarshal(merged, &out); err != nil {
		return tmpl, fmt.Errorf("%w: %w", ErrInvalidTask, err)
	}
	return out, nil
}

func runner(spec *corev1.PodSpec) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == RunnerContainer {
			return &spec.Containers[i]
		}
	}
	return nil
}

func setEnv(c *corev1.Container, e corev1.EnvVar) {
	for i := range c.Env {
		if c.Env[i].Name == e.Name {
			c.Env[i] = e
			return
		}
	}
	c.Env = append(c.Env, e)
}

// checkEnv refuses a task whose variables are not all on the allow-list,
// that sets one both plainly and secretly, or that reads one from anything
// but the pod's own fields (checkEnvSource).
func checkEnv(t Task, allow []string) error {
	for i, e := range t.Env {
		if err := checkEnvSource(i, e); err != nil {
			return err
		}
	}
	var refused []string
	check := func(name string) {
		for _, p := range allow {
			if ok, _ := path.Match(p, name); ok {
				return
			}
		}
		refused = append(refused, name)
	}
	for _, e := range t.Env {
		check(e.Name)
		_, dup := t.SecretEnv[e.Name]
		_, own := t.SourceSecretEnv[e.Name]
		if dup || own {
			return fmt.Errorf("%w: %w: %s", ErrInvalidTask, errSecretCollisions, e.Name)
		}
	}
	for k := range t.SecretEnv {
		if _, own := t.SourceSecretEnv[k]; own {
			return fmt.Errorf("%w: %w: %s", ErrInvalidTask, errSecretCollisions, k)
		}
	}
	for _, k := range sortedKeys(t.SecretEnv) {
		check(k)
	}
	if len(refused) > 0 {
		return fmt.Errorf("%w: %s (allowed: %s)", ErrEnvNotAllowed, strings.Join(refused, ", "), strings.Join(allow, ", "))
	}
	return nil
}

// checkEnvSource refuses a variable whose value the API server would fetch
// from a Secret, a ConfigMap or a file of one of the pod's volumes: the Job
// runs with the dispatcher's authority and the volumes the platform mounts,
// so such a variable would hand the task author a key the platform never
// gave them. fieldRef and resourceFieldRef read only the pod's own fields.
func checkEnvSource(i int, e corev1.EnvVar) error {
	s := e.ValueFrom
	if s == nil {
		return nil
	}
	var field string
	switch {
	case s.SecretKeyRef != nil:
		field = "secretKeyRef"
	case s.ConfigMapKeyRef != nil:
		field = "configMapKeyRef"
	case s.FileKeyRef != nil:
		field = "fileKeyRef"
	case s.FieldRef != nil, s.ResourceFieldRef != nil:
		return nil
	default:
		field = "an unknown source"
	}
	return fmt.Errorf("%w: %w: env[%d] (%s): valueFrom.%s; a task's variables carry a value, or valueFrom.fieldRef or resourceFieldRef; for a secret, use a reference such as ${vault:<path>.<key>@<namespace>} that the platform's policy allows",
		ErrInvalidTask, ErrEnvSource, i, e.Name, field)
}

func matchesAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of RunnerTask.
var GroupVersion = schema.GroupVersion{Group: "runwarden.dev", Version: "v1alpha1"}

// AddToScheme adds RunnerTask and RunnerTaskList to a scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &RunnerTask{}, &RunnerTaskList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Phase is where a task is in its life.
// +kubebuilder:validation:Enum=Pending;Queued;Running;Succeeded;Failed;Cancelled
type Phase string

// The phases of a RunnerTask.
const (
	PhasePending Phase = "Pending"
	// PhaseQueued: the task's Job waits for Kueue to admit it.
	PhaseQueued    Phase = "Queued"
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
	PhaseCancelled Phase = "Cancelled"
)

// RunnerTaskSpec is what to run.
type RunnerTaskSpec struct {
	// Image of the runner container. Default: the platform template's.
	// +optional
	Image string `json:"image,omitempty"`
	// Command of the runner container.
	// +optional
	Command []string `json:"command,omitempty"`
	// Args of the runner container.
	// +optional
	Args []string `json:"args,omitempty"`
	// Env of the runner container. Values of the form ${ssm:...},
	// ${gcp:...}, ${azure:...} or ${vault:...} are secret references the
	// webhook's policy checks and the runner resolves. A variable carries a
	// value, or valueFrom.fieldRef or resourceFieldRef (the pod's own
	// fields); secretKeyRef, configMapKeyRef and fileKeyRef are refused: a
	// task is data, never a key to anything in the cluster.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:XValidation:rule="!has(self.valueFrom) || !(has(self.valueFrom.secretKeyRef) || has(self.valueFrom.configMapKeyRef) || has(self.valueFrom.fileKeyRef))",messageExpression="'env ' + self.name + ': a task variable carries a value, or valueFrom.fieldRef or resourceFieldRef; secretKeyRef, configMapKeyRef and fileKeyRef are refused (for a secret, use a reference such as ${vault:<path>.<key>@<namespace>})'",reason=FieldValueForbidden
	Env []corev1.EnvVar `json:"env,omitempty"`
	// RepoURL is the git repository the task deploys from; it is checked
	// against the dispatcher's allow-list and set as the pod annotation
	// runwarden.dev/repo-url.
	// +optional
	RepoURL string `json:"repoURL,omitempty"`
	// Resources of the runner container. Default: the pod template's.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// ActiveDeadlineSeconds bounds the run. Default: the dispatcher's.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
	// Cancel asks the dispatcher to stop the task.
	// +optional
	Cancel bool `json:"cancel,omitempty"`
	// Queue is the Kueue LocalQueue the task waits in, when the dispatcher
	// queues through Kueue. Default: the dispatcher's --default-queue.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	Queue string `json:"queue,omitempty"`
	// PriorityClass orders waiting tasks, higher first: a Kueue
	// WorkloadPriorityClass with Kueue, else one of the dispatcher's
	// --priority-class names. Tasks of the same priority start in the
	// order they were created. Default: the dispatcher's
	// --default-priority-class.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +optional
	PriorityClass string `json:"priorityClass,omitempty"`
}

// RunnerTaskStatus is what happened.
type RunnerTaskStatus struct {
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// JobName is the Job that runs the task.
	// +optional
	JobName string `json:"jobName,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Reason is a short CamelCase word for the outcome, e.g. DeadlineExceeded.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message says what happened, with the pod's warning events on failure.
	// +optional
	Message string `json:"message,omitempty"`
	// ExitCode of the runner container, once it has ended.
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`
	// LogConfigMap keeps the end of the runner container's log once the
	// task has ended (key "log"), after its Job and pod are gone; it goes
	// with the RunnerTask. It is the ConfigMap the dispatcher made: its
	// name, the Job's with "-log-" and 5 characters the API server drew,
	// is none another user could have made ahead.
	// +optional
	LogConfigMap string `json:"logConfigMap,omitempty"`
	// Record is what the task ran, kept once it has ended: the runner
	// pod's spec as admitted, the policies, the images the node ran.
	// +optional
	Record *TaskRecord `json:"record,omitempty"`
}

// TaskRecord is what a task ran: names and digests, never a value. Two
// tasks with the same specDigest, policyDigest and image IDs ran the same
// thing.
type TaskRecord struct {
	// SpecDigest is the SHA-256 of the runner pod's spec as runwarden's
	// webhook admitted it (after the template, the task, the overlays and
	// the policies), "sha256:<hex>".
	// +optional
	SpecDigest string `json:"specDigest,omitempty"`
	// ShortSpecDigest is SpecDigest's first 12 hexadecimal digits.
	// +optional
	ShortSpecDigest string `json:"shortSpecDigest,omitempty"`
	// PolicyDigest identifies the policy set that decided.
	// +optional
	PolicyDigest string `json:"policyDigest,omitempty"`
	// TemplateDigest is the SHA-256 of the platform's pod template.
	// +optional
	TemplateDigest string `json:"templateDigest,omitempty"`
	// Mutations name what the policies changed, e.g. "env AWS_ROLE_ARN".
	// +optional
	Mutations []string `json:"mutations,omitempty"`
	// Warnings are the policies' warnings.
	// +optional
	Warnings []string `json:"warnings,omitempty"`
	// Images are the containers' images: the reference and the image ID
	// (digest) the node ran.
	// +optional
	Images []ImageRecord `json:"images,omitempty"`
	// Node ran the pod.
	// +optional
	Node string `json:"node,omitempty"`
	// Pod is the runner pod's name.
	// +optional
	Pod string `json:"pod,omitempty"`
	// StartedAt and FinishedAt are when the runner container started and
	// ended, as the kubelet reported them.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
}

// ImageRecord is one container's image.
type ImageRecord struct {
	Container string `json:"container"`
	// +optional
	Image string `json:"image,omitempty"`
	// +optional
	ImageID string `json:"imageID,omitempty"`
}

// RunnerTask is one deployment task for the dispatcher: `kubectl apply`
// submits it, `kubectl get runnertasks` shows how it went.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rt
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Job",type=string,JSONPath=`.status.jobName`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Exit",type=integer,JSONPath=`.status.exitCode`
// +kubebuilder:printcolumn:name="Spec",type=string,JSONPath=`.status.record.shortSpecDigest`,priority=1
// +kubebuilder:printcolumn:name="Policies",type=string,JSONPath=`.status.record.policyDigest`,priority=1
// +kubebuilder:printcolumn:name="Queue",type=string,JSONPath=`.spec.queue`,priority=1
// +kubebuilder:printcolumn:name="Priority",type=string,JSONPath=`.spec.priorityClass`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RunnerTask struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RunnerTaskSpec   `json:"spec,omitempty"`
	Status RunnerTaskStatus `json:"status,omitempty"`
}

// RunnerTaskList is a list of RunnerTasks.
// +kubebuilder:object:root=true
type RunnerTaskList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RunnerTask `json:"items"`
}

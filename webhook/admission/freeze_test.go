package admission

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/internal/resolve"
	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

// admittedRunner is a runner pod as the Job controller made it and the
// webhook admitted it: the Job's labels, the record, the Job controller's
// finalizer, the resolver's init container, resources, a scheduling gate
// (a pending pod).
func admittedRunner() *corev1.Pod {
	p := runnerPod("registry.example.com/runner:1")
	p.Name = "task-1-abcde"
	maps.Copy(p.Labels, map[string]string{
		batchv1.ControllerUidLabel: "job-uid-1", legacyControllerUIDLabel: "job-uid-1",
		batchv1.JobNameLabel: "task-1", "job-name": "task-1", contract.TaskID: "t-1",
	})
	p.Annotations = map[string]string{
		contract.AnnotationSpecDigest: "sha256:1", contract.AnnotationPolicyDigest: "p1", contract.AnnotationMutations: "env A",
		"runwarden.dev/repo-url": "https://git.example.com/infra.git",
	}
	p.OwnerReferences[0].BlockOwnerDeletion = ptr.To(true)
	p.Finalizers = []string{batchv1.JobTrackingFinalizer}
	p.Spec.InitContainers = []corev1.Container{{Name: resolve.InitContainer, Image: resolverImage, Args: []string{"resolve"}}}
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")},
	}
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "hold"}}
	return p
}

// plainPod is a pod of the runner namespace that is no runner.
func plainPod() *corev1.Pod {
	p := runnerPod("registry.example.com/web:1")
	p.Name, p.Labels, p.OwnerReferences = "web", map[string]string{"app": "web"}, nil
	return p
}

// TestFrozenAfterAdmission: after its admission, a runner pod's spec (every
// field an update or a subresource can change), its labels, runwarden's
// annotations and its owner references are refused to everyone, in Go
// before the policies, whatever the enforcement mode; the Job controller
// alone removes (and adds) its finalizer and releases or adopts the pod.
// On every pod of the namespace, a Job's selector labels and finalizer are
// the Job controller's: no pod is planted for a Job to adopt. The kubelet's
// status and the scheduler's binding are not decided here.
func TestFrozenAfterAdmission(t *testing.T) {
	t.Parallel()
	const alice = "system:serviceaccount:team-a:alice"
	type change func(p *corev1.Pod)
	tests := []struct {
		name string
		// old is the pod before (admittedRunner when nil); change makes
		// the pod of the request from a copy of it; create sends the
		// changed pod as a CREATE.
		old    func() *corev1.Pod
		change change
		create bool
		sub    string
		user   string // alice when ""
		audit  bool   // the platform in audit mode, every rule relaxed
		want   string // "" when allowed
	}{
		// The spec.
		{name: "the resolver's image swapped on a pending runner", change: func(p *corev1.Pod) { p.Spec.InitContainers[0].Image = "registry.example.com/evil:1" },
			want: "spec.initContainers[runwarden-secrets].image of a runner pod cannot be changed after its admission"},
		{name: "main's image swapped, from an allowed registry", change: func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.example.com/runner:2" },
			want: "spec.containers[main].image of a runner pod cannot be changed"},
		{name: "main's image swapped in audit mode", audit: true, change: func(p *corev1.Pod) { p.Spec.Containers[0].Image = "evil.example.net/runner:1" },
			want: "spec.containers[main].image of a runner pod cannot be changed"},
		{name: "main's command", change: func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"sh", "-c", "env"} },
			want: "spec.containers[main].command"},
		{name: "main's args", change: func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"--all"} },
			want: "spec.containers[main].args"},
		{name: "an env value", change: func(p *corev1.Pod) { p.Spec.Containers[0].Env[0].Value = "${vault:secret/other.password@team-a}" },
			want: "spec.containers[main].env[DB_PASSWORD].value"},
		{name: "envFrom added", change: func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "vault-token"}}}}
		}, want: "spec.containers[main].envFrom"},
		{name: "a mount added", change: func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: resolve.Volume, MountPath: "/x"}}
		}, want: "spec.containers[main].volumeMounts"},
		{name: "a security context", change: func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
		}, want: "spec.containers[main].securityContext"},
		{name: "resources through pods/resize", sub: "resize", change: func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("150m")
		}, want: "spec.containers[main].resources.requests.cpu of a runner pod cannot be changed after its admission (pods/resize)"},
		{name: "a toleration added", change: func(p *corev1.Pod) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists})
		}, want: "spec.tolerations"},
		{name: "activeDeadlineSeconds set", change: func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = ptr.To[int64](5) },
			want: "spec.activeDeadlineSeconds"},
		{name: "the scheduling gates removed", change: func(p *corev1.Pod) { p.Spec.SchedulingGates = nil },
			want: "spec.schedulingGates"},
		{name: "the Job controller changes the spec", user: jobController, change: func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.example.com/runner:2" },
			want: "spec.containers[main].image"},
		{name: "an ephemeral container changed", sub: "ephemeralcontainers", old: withDebugger, change: func(p *corev1.Pod) {
			p.Spec.EphemeralContainers[0].Image = "registry.example.com/other:1"
		}, want: "spec.ephemeralContainers[debugger] of a runner pod cannot be changed after its admission (pods/ephemeralcontainers)"},
		{name: "the spec through pods/ephemeralcontainers", sub: "ephemeralcontainers", change: func(p *corev1.Pod) {
			p.Spec.Containers[0].Image = "registry.example.com/runner:2"
		}, want: "spec.containers[main].image of a runner pod cannot be changed after its admission (pods/ephemeralcontainers)"},
		{name: "a new ephemeral container goes on to the policies", sub: "ephemeralcontainers", change: func(p *corev1.Pod) {
			p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example.com/debug:1"}}}
		}, want: "no-ephemeral-containers"},

		// The labels.
		{name: "the Job's selector relabelled", change: func(p *corev1.Pod) { p.Labels[batchv1.ControllerUidLabel] = "job-uid-2" },
			want: "the label batch.kubernetes.io/controller-uid of a runner pod cannot be changed"},
		{name: "the Job's legacy selector relabelled", change: func(p *corev1.Pod) { p.Labels[legacyControllerUIDLabel] = "job-uid-2" },
			want: "the label controller-uid of a runner pod cannot be changed"},
		{name: "the Job's name relabelled", change: func(p *corev1.Pod) { p.Labels[batchv1.JobNameLabel] = "task-2" },
			want: "the label batch.kubernetes.io/job-name of a runner pod cannot be changed"},
		{name: "the Job's legacy name removed", change: func(p *corev1.Pod) { delete(p.Labels, "job-name") },
			want: "the label job-name of a runner pod cannot be changed"},
		{name: "a label added", change: func(p *corev1.Pod) { p.Labels["team"] = "b" },
			want: "the label team of a runner pod cannot be changed"},
		{name: "the Job controller relabels", user: jobController, change: func(p *corev1.Pod) { p.Labels[batchv1.ControllerUidLabel] = "job-uid-2" },
			want: "the label batch.kubernetes.io/controller-uid of a runner pod cannot be changed"},

		// The annotations.
		{name: "runwarden's repository annotation changed", change: func(p *corev1.Pod) { p.Annotations["runwarden.dev/repo-url"] = "https://evil.example.net/x.git" },
			want: "the annotation runwarden.dev/repo-url of a runner pod cannot be changed"},
		{name: "another annotation", change: func(p *corev1.Pod) { p.Annotations["note"] = "x" }},

		// The owner references.
		{name: "the controller reference removed", change: func(p *corev1.Pod) { p.OwnerReferences = nil },
			want: "the controller reference of a runner pod cannot be changed"},
		{name: "the controller reference given another Job", change: func(p *corev1.Pod) { p.OwnerReferences[0].UID, p.OwnerReferences[0].Name = "job-uid-2", "task-2" },
			want: "the controller reference of a runner pod cannot be changed"},
		{name: "a second owner added", change: func(p *corev1.Pod) {
			p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "mine", UID: "cm-1"})
		}, want: "the owner references of a runner pod cannot be changed"},
		{name: "the Job controller releases the pod", user: jobController, change: func(p *corev1.Pod) { p.OwnerReferences, p.Finalizers = nil, nil }},
		{name: "the Job controller adds a second owner", user: jobController, change: func(p *corev1.Pod) {
			p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: "task-2", UID: "job-uid-2"})
		}, want: "the owner references of a runner pod cannot be changed"},

		// The Job controller's finalizer.
		{name: "the Job controller's finalizer removed", change: func(p *corev1.Pod) { p.Finalizers = nil },
			want: "the finalizer batch.kubernetes.io/job-tracking of a pod is added and removed by the Job controller only"},
		{name: "the Job controller removes its finalizer, the policies not asked", user: jobController, old: func() *corev1.Pod {
			// A pod the policies would refuse now: they decided it at its
			// creation, and the finalizer is not its shape.
			p := admittedRunner()
			p.Spec.Containers[0].Image = "evil.example.net/runner:1"
			return p
		}, change: func(p *corev1.Pod) { p.Finalizers = nil }},
		{name: "another finalizer added", change: func(p *corev1.Pod) { p.Finalizers = append(p.Finalizers, "example.com/hold") }},
		{name: "the Job controller's finalizer removed from a plain pod", old: func() *corev1.Pod {
			p := plainPod()
			p.Finalizers = []string{batchv1.JobTrackingFinalizer}
			return p
		}, change: func(p *corev1.Pod) { p.Finalizers = nil }, want: "the finalizer batch.kubernetes.io/job-tracking"},

		// Pods planted for a Job to adopt.
		{name: "a pod planted with a Job's selector", create: true, old: plainPod, change: func(p *corev1.Pod) { p.Labels[batchv1.ControllerUidLabel] = "job-uid-1" },
			want: "the label batch.kubernetes.io/controller-uid is the Job controller's"},
		{name: "a pod planted with a Job's legacy selector", create: true, old: plainPod, change: func(p *corev1.Pod) { p.Labels[legacyControllerUIDLabel] = "job-uid-1" },
			want: "the label controller-uid is the Job controller's"},
		{name: "a Job's pod made by the Job controller", create: true, user: jobController, old: plainPod, change: func(p *corev1.Pod) {
			p.Labels[batchv1.ControllerUidLabel], p.Labels[legacyControllerUIDLabel] = "job-uid-9", "job-uid-9"
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "other", UID: "job-uid-9", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
			p.Finalizers = []string{batchv1.JobTrackingFinalizer}
		}},
		// A pod made with a Job as its controller and the Job controller's
		// finalizer, its labels to come through pods/status (the writers
		// policy's), would pass for the Job's pod: each is refused alone.
		{name: "a pod planted with a Job as its controller", create: true, old: plainPod, change: func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "task-1", UID: "job-uid-1", Controller: ptr.To(true)}}
		}, want: "a pod controlled by Job task-1 is made by the Job controller"},
		{name: "a pod planted with the Job controller's finalizer", create: true, old: plainPod, change: func(p *corev1.Pod) {
			p.Finalizers = []string{batchv1.JobTrackingFinalizer}
		}, want: "the finalizer batch.kubernetes.io/job-tracking is the Job controller's"},
		{name: "a pod made with a Job as an owner but not its controller", create: true, old: plainPod, change: func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "task-1", UID: "job-uid-1"}}
		}},
		{name: "a Job's pod labelled with another Job's UID (spec.manualSelector)", create: true, user: jobController, old: plainPod, change: func(p *corev1.Pod) {
			p.Labels[batchv1.ControllerUidLabel], p.Labels["x"] = "job-uid-1", "y"
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "mine", UID: "job-uid-9", Controller: ptr.To(true)}}
			p.Finalizers = []string{batchv1.JobTrackingFinalizer}
		}, want: "the label batch.kubernetes.io/controller-uid=job-uid-1 of a pod the Job controller makes names another Job"},
		{name: "a Job's pod with another Job's UID in the legacy label", create: true, user: jobController, old: plainPod, change: func(p *corev1.Pod) {
			p.Labels[legacyControllerUIDLabel] = "job-uid-1"
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "mine", UID: "job-uid-9", Controller: ptr.To(true)}}
		}, want: "the label controller-uid=job-uid-1"},
		{name: "a Job made the controller of a plain pod", old: plainPod, change: func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "task-1", UID: "job-uid-1", Controller: ptr.To(true)}}
		}, want: "Job task-1 is made the controller of a pod by the Job controller alone"},
		{name: "a plain pod's Job controller released", old: func() *corev1.Pod {
			p := plainPod()
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "task-1", UID: "job-uid-1", Controller: ptr.To(true)}}
			return p
		}, change: func(p *corev1.Pod) { p.OwnerReferences = nil }},
		{name: "a pod made with another controller", create: true, old: plainPod, change: func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: "rs-1", Controller: ptr.To(true)}}
		}},
		{name: "a Job's selector added to a plain pod", old: plainPod, change: func(p *corev1.Pod) { p.Labels[batchv1.ControllerUidLabel] = "job-uid-1" },
			want: "the label batch.kubernetes.io/controller-uid of a pod cannot be added, removed or changed"},
		{name: "another label on a plain pod", old: plainPod, change: func(p *corev1.Pod) { p.Labels["team"] = "b" }},
		{name: "the Job controller adopts a plain pod", user: jobController, old: plainPod, change: func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "other", UID: "job-uid-9", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
			p.Finalizers = []string{batchv1.JobTrackingFinalizer}
		}},
		{name: "a plain pod resized goes on to the policies", sub: "resize", old: plainPod, change: func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m")}
		}},

		// The kubelet's and the scheduler's.
		{name: "the kubelet's status", sub: "status", user: "system:node:node-1", change: func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
		}},
		{name: "the scheduler's binding", create: true, sub: "binding", user: "system:kube-scheduler", change: func(p *corev1.Pod) {
			p.Spec.NodeName = "node-1"
		}},
	}
	validating, audit := newHandler(t, false), auditHandler(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			old := admittedRunner()
			if tt.old != nil {
				old = tt.old()
			}
			pod := old.DeepCopy()
			tt.change(pod)
			req := request(t, pod)
			req.UserInfo.Username, req.SubResource = cmpOr(tt.user, alice), tt.sub
			if !tt.create {
				raw, err := json.Marshal(old)
				if err != nil {
					t.Fatal(err)
				}
				req.Operation, req.OldObject.Raw = admissionv1.Update, raw
			}
			h := validating
			if tt.audit {
				h = audit
			}
			resp := h.Handle(t.Context(), req)
			type verdict struct {
				Allowed bool
				Names   string
			}
			want, got := verdict{Allowed: tt.want == "", Names: tt.want}, verdict{Allowed: resp.Allowed}
			if strings.Contains(resp.Result.Message, tt.want) {
				got.Names = tt.want
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s\nmessage: %s", diff, resp.Result.Message)
			}
		})
	}
}

// withDebugger is admittedRunner with an ephemeral container.
func withDebugger() *corev1.Pod {
	p := admittedRunner()
	p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example.com/debug:1"}}}
	return p
}

// auditHandler is newHandler's validating handler with the platform in
// audit mode: every rule of the policies warns instead of denying.
func auditHandler(t *testing.T) *Handler {
	t.Helper()
	cfg := maps.Clone(platformConfig)
	cfg["mode"] = "audit"
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithObjects(handlerObjects()...).Build()
	return New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: cfg})
}

func cmpOr(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// TestSpecChangedNamesTheField: the path of the first field that differs,
// a list's element by its name.
func TestSpecChangedNamesTheField(t *testing.T) {
	t.Parallel()
	base := admittedRunner().Spec
	tests := []struct {
		name   string
		change func(*corev1.PodSpec)
		sub    string
		want   string
	}{
		{name: "unchanged", change: func(*corev1.PodSpec) {}},
		{name: "an init container's image", change: func(s *corev1.PodSpec) { s.InitContainers[0].Image = "x" }, want: "spec.initContainers[runwarden-secrets].image"},
		{name: "a container added", change: func(s *corev1.PodSpec) {
			s.Containers = append(s.Containers, corev1.Container{Name: "side", Image: "x"})
		}, want: "spec.containers[side]"},
		{name: "a list element without a name", change: func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "a"}}
		}, want: "spec.tolerations"},
		{name: "a nested field", change: func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
		},
			want: "spec.containers[main].resources.limits.cpu"},
		{name: "an ephemeral container added through its subresource", sub: "ephemeralcontainers", change: func(s *corev1.PodSpec) {
			s.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "d"}}}
		}},
		{name: "an ephemeral container added by an update", change: func(s *corev1.PodSpec) {
			s.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "d"}}}
		}, want: "spec.ephemeralContainers"},
		{name: "the same quantity written otherwise", change: func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("0.2")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			old, spec := base.DeepCopy(), base.DeepCopy()
			tt.change(spec)
			if diff := cmp.Diff(tt.want, specChanged(old, spec, tt.sub)); diff != "" {
				t.Errorf("specChanged (-want +got):\n%s", diff)
			}
		})
	}
}

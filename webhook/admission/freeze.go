package admission

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runwarden/runwarden/internal/contract"
)

// What a pod keeps from its admission. A runner pod runs what was admitted
// or nothing: after its creation, its spec (every container, init and
// ephemeral container, and every field an update or a subresource may
// change), its labels, runwarden's annotations and its owner references
// are frozen for everyone, but for what its controllers own. The Job
// controller (Options.JobControllerUsers; k8s.io/kubernetes v1.37
// pkg/controller/job) writes three things on the pods of its Jobs after
// their creation: it removes its finalizer batch.kubernetes.io/job-tracking
// once it counted the pod, it adopts an orphan pod its Job's selector
// matches (adding its controller reference and the finalizer) and it
// releases a pod the selector no longer matches (removing both). It never
// changes a pod's spec or labels. The kubelet writes the status
// (pods/status) and the scheduler binds (pods/binding): neither is sent to
// the webhook. New ephemeral containers (pods/ephemeralcontainers) are the
// policies' to decide, as at creation.
//
// And on every pod of the runner namespace: a Job's selector labels, its
// finalizer and a Job's controller reference are the Job controller's
// alone, at a pod's creation and after, so that no pod becomes one of a
// runner Job's pods by adoption or by being made so, and none stops being
// counted. What pods/status and pods/binding may write of a pod's metadata
// (its labels and annotations; they do not reach the webhook) the chart's
// writers policy decides (templates/writers-policy.yaml).

// jobSelectorLabels are the labels a Job selects its pods by: the API
// server sets batch.kubernetes.io/controller-uid (and, on Jobs of before
// Kubernetes 1.27, controller-uid) to the Job's UID in its selector and
// its pod template. A pod carrying one of them with a Job's UID, and no
// controller, is adopted by that Job.
var jobSelectorLabels = [...]string{batchv1.ControllerUidLabel, legacyControllerUIDLabel}

// legacyControllerUIDLabel is the selector label of Jobs of before
// Kubernetes 1.27, which the API server still puts on every Job's pod
// template (k8s.io/kubernetes pkg/apis/batch LegacyControllerUidLabel).
const legacyControllerUIDLabel = "controller-uid"

// jobTrackingFinalizer is the Job controller's finalizer on its pods: a
// pod that ends without it is taken as counted already, so the Job
// controller starts another in its place.
const jobTrackingFinalizer = batchv1.JobTrackingFinalizer

// frozen says why a request changes what its pod keeps from its admission,
// or is "": runner is whether the pod is a runner pod (the runner label's
// addition or removal is refused before), jobController whether the
// request's user is one of the Job controller's.
func frozen(req Request, runner, jobController bool) string {
	pod, old := req.Pod, req.OldPod
	if old == nil {
		if jobController {
			return foreignSelector(pod)
		}
		if l := firstLabel(pod.Labels, jobSelectorLabels[:]); l != "" {
			return fmt.Sprintf("runwarden: the label %s is the Job controller's, set on the pods it makes for a Job (its selector): a pod that carries it is adopted by that Job, and counted as its pod; this pod is created by %s; remove the label", l, req.User)
		}
		if runner {
			// Earned or refused (Handler.earned): made by the Job
			// controller for a Job of the dispatcher's, or by no one.
			return ""
		}
		if slices.Contains(pod.Finalizers, jobTrackingFinalizer) {
			return fmt.Sprintf("runwarden: the finalizer %s is the Job controller's, on the pods it makes for a Job and counts; this pod is created by %s; remove it", jobTrackingFinalizer, req.User)
		}
		if ref := jobControllerOf(pod); ref != nil {
			return fmt.Sprintf("runwarden: a pod controlled by Job %s is made by the Job controller, not by %s: a pod created with a Job as its controller passes for one of that Job's pods; remove the owner reference", ref.Name, req.User)
		}
		return ""
	}
	if runner {
		if why := runnerChanged(req, jobController); why != "" {
			return why
		}
	}
	if jobController {
		return ""
	}
	for _, l := range jobSelectorLabels {
		was, had := old.Labels[l]
		is, has := pod.Labels[l]
		if had != has || was != is {
			return fmt.Sprintf("runwarden: the label %s of a pod cannot be added, removed or changed: it is the Job controller's, a Job's selector, by which a Job adopts a pod and counts it", l)
		}
	}
	if slices.Contains(old.Finalizers, jobTrackingFinalizer) != slices.Contains(pod.Finalizers, jobTrackingFinalizer) {
		return fmt.Sprintf("runwarden: the finalizer %s of a pod is added and removed by the Job controller only: a pod that ends without it is not counted by its Job, which starts another in its place", jobTrackingFinalizer)
	}
	// Given a Job as its controller afterwards, a pod passes for that
	// Job's as if made so; a release (the garbage collector orphaning it)
	// stays allowed.
	if ref := jobControllerOf(pod); ref != nil {
		if was := metav1.GetControllerOfNoCopy(old); was == nil || was.UID != ref.UID {
			return fmt.Sprintf("runwarden: Job %s is made the controller of a pod by the Job controller alone (it adopts the pods its selector matches), not by %s", ref.Name, req.User)
		}
	}
	return ""
}

// jobControllerOf is pod's controller reference when a Job is its
// controller, or nil.
func jobControllerOf(pod *corev1.Pod) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != "Job" || !strings.HasPrefix(ref.APIVersion, batchv1.GroupName+"/") {
		return nil
	}
	return ref
}

// foreignSelector says why a pod the Job controller creates is refused, or
// is "": its Job's selector labels name another Job's UID than its
// controller's. A Job made with spec.manualSelector chooses its selector
// and its pods' labels, so its pods could carry a runner Job's UID and,
// released by their own Job, be adopted and counted by that one.
func foreignSelector(pod *corev1.Pod) string {
	ref := metav1.GetControllerOfNoCopy(pod)
	for _, l := range jobSelectorLabels {
		v, ok := pod.Labels[l]
		if ok && (ref == nil || string(ref.UID) != v) {
			return fmt.Sprintf("runwarden: the label %s=%s of a pod the Job controller makes names another Job than the pod's own (a Job with spec.manualSelector chose it): a pod carrying a Job's UID there is adopted and counted by that Job once its own releases it", l, v)
		}
	}
	return ""
}

// runnerChanged says why an update changes what a runner pod keeps from
// its admission, or is "": its spec, its labels, runwarden's annotations,
// its owner references.
func runnerChanged(req Request, jobController bool) string {
	pod, old := req.Pod, req.OldPod
	if path := specChanged(&old.Spec, &pod.Spec, req.SubResource); path != "" {
		via := ""
		if req.SubResource != "" {
			via = " (pods/" + req.SubResource + ")"
		}
		return fmt.Sprintf("runwarden: %s of a runner pod cannot be changed after its admission%s: a runner pod runs what was admitted or nothing (the kubelet restarts a container whose spec changed, with the pod's credentials); submit the change as a new task", path, via)
	}
	if l := changedKey(old.Labels, pod.Labels, func(string) bool { return true }); l != "" {
		return fmt.Sprintf("runwarden: the label %s of a runner pod cannot be changed: a runner pod's labels are its Job's and runwarden's, by which the Job controller counts the pod and the dispatcher tells whose task it is", l)
	}
	if k := recordChanged(old, pod); k != "" {
		return fmt.Sprintf("runwarden: the annotation %s of a runner pod cannot be changed: it is the webhook's record of what it admitted, written at the pod's creation and read by the dispatcher into the task's record", k)
	}
	if k := changedKey(old.Annotations, pod.Annotations, func(k string) bool { return strings.HasPrefix(k, contract.Prefix) }); k != "" {
		return fmt.Sprintf("runwarden: the annotation %s of a runner pod cannot be changed: runwarden's annotations are written at the pod's creation", k)
	}
	return ownersChanged(old, pod, jobController)
}

// ownersChanged says why an update's change of a runner pod's owner
// references is refused, or is "". The Job controller may release the pod
// (remove its Job's controller reference) or adopt it (add one to a pod
// with no controller), and nothing else; no one else changes them: a
// runner pod released from its Job is no longer counted by it (the Job
// starts another while it runs on), and a second owner's deletion would
// delete it.
func ownersChanged(old, pod *corev1.Pod, jobController bool) string {
	if apiequality.Semantic.DeepEqual(old.OwnerReferences, pod.OwnerReferences) {
		return ""
	}
	was, is := metav1.GetControllerOfNoCopy(old), metav1.GetControllerOfNoCopy(pod)
	if jobController {
		switch {
		case was != nil && is == nil && isJobRef(*was) && apiequality.Semantic.DeepEqual(pod.OwnerReferences, without(old.OwnerReferences, *was)):
			return ""
		case was == nil && is != nil && isJobRef(*is) && apiequality.Semantic.DeepEqual(old.OwnerReferences, without(pod.OwnerReferences, *is)):
			return ""
		}
	}
	const why = "a runner pod belongs to the Job it was admitted for: released, its Job no longer counts it and starts another while it runs on, unseen by the dispatcher"
	if (was == nil) != (is == nil) || (was != nil && !apiequality.Semantic.DeepEqual(*was, *is)) {
		return "runwarden: the controller reference of a runner pod cannot be changed: " + why
	}
	return "runwarden: the owner references of a runner pod cannot be changed: " + why + "; and another owner's deletion would delete it"
}

func isJobRef(r metav1.OwnerReference) bool {
	return r.Kind == "Job" && r.APIVersion == "batch/v1"
}

// without is refs without r.
func without(refs []metav1.OwnerReference, r metav1.OwnerReference) []metav1.OwnerReference {
	return slices.DeleteFunc(slices.Clone(refs), func(o metav1.OwnerReference) bool { return o.UID == r.UID })
}

// controllersOnly tells whether an update changes nothing but what the
// Job controller owns (finalizers, owner references) of a pod whose spec,
// labels and annotations stay as they are: the controller's bookkeeping,
// not the pod's shape, which the policies decided at its creation.
func controllersOnly(old, pod *corev1.Pod) bool {
	return maps.Equal(old.Labels, pod.Labels) && maps.Equal(old.Annotations, pod.Annotations) &&
		apiequality.Semantic.DeepEqual(old.Spec, pod.Spec)
}

// firstLabel is the first of keys that labels holds, or "".
func firstLabel(labels map[string]string, keys []string) string {
	for _, k := range keys {
		if _, ok := labels[k]; ok {
			return k
		}
	}
	return ""
}

// changedKey is the first key (sorted) that is added, removed or changed
// between a and b, among those keep selects, or "".
func changedKey(a, b map[string]string, keep func(string) bool) string {
	if maps.Equal(a, b) {
		return ""
	}
	keys := slices.Sorted(maps.Keys(a))
	keys = append(keys, slices.Sorted(maps.Keys(b))...)
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		was, had := a[k]
		is, has := b[k]
		if keep(k) && (had != has || was != is) {
			return k
		}
	}
	return ""
}

// specChanged names the first field of a pod's spec that an update
// changes, as a path ("spec.initContainers[runwarden-secrets].image"), or
// is "". Through pods/ephemeralcontainers, ephemeral containers may be
// added (the policies decide on them), not changed or removed.
func specChanged(old, spec *corev1.PodSpec, sub string) string {
	if sub == "ephemeralcontainers" {
		was, is := old.EphemeralContainers, spec.EphemeralContainers
		if len(is) < len(was) {
			return "spec.ephemeralContainers"
		}
		for i := range was {
			if !apiequality.Semantic.DeepEqual(was[i], is[i]) {
				return "spec.ephemeralContainers[" + was[i].Name + "]"
			}
		}
		o, s := *old, *spec
		o.EphemeralContainers, s.EphemeralContainers = nil, nil
		old, spec = &o, &s
	}
	if apiequality.Semantic.DeepEqual(old, spec) {
		return ""
	}
	if path := firstDiff("spec", jsonValue(old), jsonValue(spec)); path != "" {
		return path
	}
	// Equal as JSON, unequal as Go values: the API server stores the JSON.
	return ""
}

// jsonValue is v as encoding/json decodes its encoding into an any.
func jsonValue(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return string(b)
	}
	return out
}

// firstDiff is the path of the first place (keys sorted) where a and b,
// decoded JSON, differ, or "". A list's element is named by its "name"
// when it has one (containers, volumes, env), else by its index.
func firstDiff(path string, a, b any) string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			return path
		}
		keys := slices.Sorted(maps.Keys(av))
		keys = append(keys, slices.Sorted(maps.Keys(bv))...)
		slices.Sort(keys)
		for _, k := range slices.Compact(keys) {
			if p := firstDiff(path+"."+k, av[k], bv[k]); p != "" {
				return p
			}
		}
		return ""
	case []any:
		bv, ok := b.([]any)
		if !ok {
			return path
		}
		for i := range max(len(av), len(bv)) {
			var x, y any
			if i < len(av) {
				x = av[i]
			}
			if i < len(bv) {
				y = bv[i]
			}
			if p := firstDiff(path+"["+element(x, y, i)+"]", x, y); p != "" {
				return p
			}
		}
		return ""
	}
	if reflect.DeepEqual(a, b) {
		return ""
	}
	return path
}

// element names a list's element i: by the name of x or y, else by i.
func element(x, y any, i int) string {
	for _, v := range []any{x, y} {
		if m, ok := v.(map[string]any); ok {
			if n, ok := m["name"].(string); ok && n != "" {
				return n
			}
		}
	}
	return strconv.Itoa(i)
}

package admission

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/internal/resolve"
	"github.com/runwarden/runwarden/webhook/policy"
)

// Resolver is the init container that resolves a runner's secret
// references (runwarden-webhook resolve, in a runwarden image).
type Resolver struct {
	// Image is the runwarden image holding runwarden-webhook. Required.
	Image string
	// PullPolicy is the image's pull policy. Default: the cluster's.
	PullPolicy corev1.PullPolicy
	// Delivery is how the values reach the runner: resolve.DeliveryEnvFile
	// (the default) or resolve.DeliveryFiles (platform configuration
	// secretDelivery), for clusters without EnvFiles.
	Delivery string

	// resources are the init container's, parsed once (New) with their
	// strings cached for encoding; PlanSecrets copies them into each pod.
	resources *corev1.ResourceRequirements
}

// resolverResources are the resolver init container's requests and limits.
func resolverResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
	}
}

// withResources is r with its init container's resources parsed and
// their canonical strings cached (Quantity.String), which every pod's
// copy then encodes without formatting them again.
func (r Resolver) withResources() Resolver {
	res := resolverResources()
	for _, l := range []corev1.ResourceList{res.Requests, res.Limits} {
		for name, q := range l {
			_ = q.String()
			l[name] = q
		}
	}
	r.resources = &res
	return r
}

// ErrResolverInTheWay is a pod with secret references and a container of
// its own named like the resolver: the references would reach the runner
// as their text.
var ErrResolverInTheWay = errors.New("the resolver's container name is taken")

// envFileSize bounds the in-memory volume the env file is written to.
var envFileSize = resource.MustParse("1Mi")

// PlanSecrets rewrites every variable of pod whose literal value holds
// secret references into a fileKeyRef on the env file the resolver init
// container writes, and adds that container (first, so other init
// containers get the values too) and its in-memory volume. The references
// and the variables' values as written go to the init container, encoded
// (so they are not read as references again); the values never reach the
// API server. A pod without references, or with a malformed one (the
// policies deny it), is left as it is. It returns whether it changed pod.
func PlanSecrets(pod *corev1.Pod, r Resolver) (bool, error) {
	var vars []resolve.Var
	rewrite := func(cs []corev1.Container) {
		for i := range cs {
			c := &cs[i]
			for j := range c.Env {
				e := &c.Env[j]
				if e.ValueFrom != nil || !strings.Contains(e.Value, "${") {
					continue
				}
				refs := policy.ParseSecretRef(c.Name, e.Name, e.Value)
				if len(refs) == 0 || slices.ContainsFunc(refs, func(r policy.SecretRef) bool { return r.Error != "" }) {
					continue
				}
				v := resolve.Var{Key: "RW_" + strconv.Itoa(len(vars)), Container: c.Name, Env: e.Name, Value: e.Value}
				for _, ref := range refs {
					v.Refs = append(v.Refs, resolve.Ref{Store: ref.Store, Name: ref.Name, Vault: ref.Vault, Key: ref.Key, Raw: ref.Raw})
				}
				vars = append(vars, v)
				if r.Delivery == resolve.DeliveryFiles {
					*e = corev1.EnvVar{Name: e.Name + resolve.FileSuffix, Value: resolve.MountPath + "/" + v.Key}
					if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == resolve.Volume }) {
						c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: resolve.Volume, MountPath: resolve.MountPath, ReadOnly: true})
					}
					continue
				}
				*e = corev1.EnvVar{Name: e.Name, ValueFrom: &corev1.EnvVarSource{FileKeyRef: &corev1.FileKeySelector{
					VolumeName: resolve.Volume, Path: resolve.EnvFile, Key: v.Key,
				}}}
			}
		}
	}
	if slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == resolve.InitContainer }) {
		// Planned before (a reinvocation: no reference is left), or a
		// container of the pod's own has the resolver's name.
		if slices.ContainsFunc(policy.PodSecretRefs(pod), func(r policy.SecretRef) bool { return r.Error == "" }) {
			return false, fmt.Errorf("%w: the pod has an init container named %s of its own, so its secret references cannot be resolved; rename it", ErrResolverInTheWay, resolve.InitContainer)
		}
		return false, nil
	}
	rewrite(pod.Spec.InitContainers)
	rewrite(pod.Spec.Containers)
	if len(vars) == 0 {
		return false, nil
	}
	spec, err := json.Marshal(vars)
	if err != nil {
		return false, fmt.Errorf("encoding the secret references: %w", err)
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: resolve.Volume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &envFileSize},
	}})
	var resources corev1.ResourceRequirements
	if r.resources != nil {
		r.resources.DeepCopyInto(&resources)
	} else {
		resources = resolverResources()
	}
	init := corev1.Container{
		Name: resolve.InitContainer, Image: r.Image, ImagePullPolicy: r.PullPolicy,
		Args:                     []string{"resolve", "--delivery", cmp.Or(r.Delivery, resolve.DeliveryEnvFile)},
		Env:                      []corev1.EnvVar{{Name: resolve.SpecEnv, Value: base64.StdEncoding.EncodeToString(spec)}},
		VolumeMounts:             []corev1.VolumeMount{{Name: resolve.Volume, MountPath: resolve.MountPath}},
		Resources:                resources,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	pod.Spec.InitContainers = append([]corev1.Container{init}, pod.Spec.InitContainers...)
	return true, nil
}

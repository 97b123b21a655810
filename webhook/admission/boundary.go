package admission

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/internal/resolve"
)

// RulePlatformSecret is the rule that keeps the platform's Secrets to runner
// pods, and a secret store's to the resolver init container of a runner
// pod. It is decided in Go, before the policies, in every enforcement mode
// (docs/policy.md, boundary rules): a container's Secret references are
// per task (the dispatcher's rw-secret-<Job>), and the policies' decision
// cache keys on every field the policies read.
const RulePlatformSecret = "platform-secret"

// maxBoundaryFindings bounds how many references a refusal names.
const maxBoundaryFindings = 8

// platformSecrets says why pod may not have a Secret it names, or "" when
// it may. The platform's Secrets are those its configuration names (the
// secret stores' secretName, the credential sets', and runner.secrets, the
// runner pod template's, which the chart writes): a pod that is not a
// runner names none of them, anywhere (env, envFrom, volumes of any kind,
// imagePullSecrets); in a runner pod, a secret store's Secret is read or
// mounted by the resolver init container alone.
func platformSecrets(cfg map[string]any, pod *corev1.Pod, runner bool) string {
	var found []string
	add := func(format string, args ...any) {
		if len(found) < maxBoundaryFindings {
			found = append(found, fmt.Sprintf(format, args...))
		}
	}
	check := func(list string, c *corev1.Container) {
		if runner && c.Name == resolve.InitContainer {
			return
		}
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			if owner, store := platformSecretOwner(cfg, e.ValueFrom.SecretKeyRef.Name); owner != "" && (store || !runner) {
				add("container %q reads Secret %q (spec.%s[%s].env[%s].valueFrom.secretKeyRef.name), %s", c.Name, e.ValueFrom.SecretKeyRef.Name, list, c.Name, e.Name, owner)
			}
		}
		for i, f := range c.EnvFrom {
			if f.SecretRef == nil {
				continue
			}
			if owner, store := platformSecretOwner(cfg, f.SecretRef.Name); owner != "" && (store || !runner) {
				add("container %q reads Secret %q (spec.%s[%s].envFrom[%d].secretRef.name), %s", c.Name, f.SecretRef.Name, list, c.Name, i, owner)
			}
		}
		if !runner {
			return
		}
		for _, m := range c.VolumeMounts {
			for _, ref := range volumeSecrets(pod.Spec.Volumes, m.Name) {
				if owner, store := platformSecretOwner(cfg, ref.secret); store {
					add("container %q mounts volume %q of Secret %q (spec.%s[%s].volumeMounts[%s]), %s", c.Name, m.Name, ref.secret, list, c.Name, m.Name, owner)
				}
			}
		}
	}
	for i := range pod.Spec.InitContainers {
		check("initContainers", &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		check("containers", &pod.Spec.Containers[i])
	}
	for i := range pod.Spec.EphemeralContainers {
		check("ephemeralContainers", (*corev1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	if !runner {
		for _, ref := range volumeSecrets(pod.Spec.Volumes, "") {
			if owner, _ := platformSecretOwner(cfg, ref.secret); owner != "" {
				add("volume %q reads Secret %q (spec.volumes[%s].%s), %s", ref.volume, ref.secret, ref.volume, ref.field, owner)
			}
		}
		for i, s := range pod.Spec.ImagePullSecrets {
			if owner, _ := platformSecretOwner(cfg, s.Name); owner != "" {
				add("image pull Secret %q (spec.imagePullSecrets[%d].name) is %s", s.Name, i, owner)
			}
		}
	}
	if len(found) == 0 {
		return ""
	}
	why := "only runner pods get the platform's Secrets"
	if runner {
		why = "only the resolver init container " + resolve.InitContainer + " gets a secret store's credentials"
	}
	return fmt.Sprintf("runwarden: %s: %s: %s; whatever the enforcement mode (a boundary rule, docs/policy.md)", RulePlatformSecret, strings.Join(found, "; "), why)
}

// platformSecretOwner says which part of the platform configuration names
// Secret name ("" for none), and whether it is a secret store's.
func platformSecretOwner(cfg map[string]any, name string) (owner string, store bool) {
	if name == "" {
		return "", false
	}
	stores, _ := cfg["secretStores"].(map[string]any)
	for _, k := range []string{"aws", "gcp", "azure", "vault"} {
		s, _ := stores[k].(map[string]any)
		if n, _ := s["secretName"].(string); n == name {
			return "a secret store's credentials (secretStores." + k + ".secretName)", true
		}
	}
	sets, _ := cfg["credentialSets"].([]any)
	for _, v := range sets {
		s, _ := v.(map[string]any)
		if n, _ := s["secretName"].(string); n == name {
			setName, _ := s["name"].(string)
			return "the platform's (credential set " + setName + ")", false
		}
	}
	runner, _ := cfg["runner"].(map[string]any)
	secrets, _ := runner["secrets"].([]any)
	for _, v := range secrets {
		if n, _ := v.(string); n == name {
			return "the platform's (the runner pod template's)", false
		}
	}
	return "", false
}

// volumeSecret is a Secret a volume names, for its content or for the
// kubelet to mount it with.
type volumeSecret struct {
	volume, field, secret string
}

// volumeSecrets are the Secrets the volume named name names, or every
// volume's when name is "".
func volumeSecrets(volumes []corev1.Volume, name string) []volumeSecret {
	var out []volumeSecret
	for i := range volumes {
		v := &volumes[i]
		if name != "" && v.Name != name {
			continue
		}
		add := func(field, secret string) {
			if secret != "" {
				out = append(out, volumeSecret{volume: v.Name, field: field, secret: secret})
			}
		}
		switch {
		case v.Secret != nil:
			add("secret.secretName", v.Secret.SecretName)
		case v.Projected != nil:
			for j, s := range v.Projected.Sources {
				if s.Secret != nil {
					add(fmt.Sprintf("projected.sources[%d].secret.name", j), s.Secret.Name)
				}
			}
		case v.AzureFile != nil:
			add("azureFile.secretName", v.AzureFile.SecretName)
		case v.CSI != nil && v.CSI.NodePublishSecretRef != nil:
			add("csi.nodePublishSecretRef.name", v.CSI.NodePublishSecretRef.Name)
		case v.CephFS != nil && v.CephFS.SecretRef != nil:
			add("cephfs.secretRef.name", v.CephFS.SecretRef.Name)
		case v.RBD != nil && v.RBD.SecretRef != nil:
			add("rbd.secretRef.name", v.RBD.SecretRef.Name)
		case v.ISCSI != nil && v.ISCSI.SecretRef != nil:
			add("iscsi.secretRef.name", v.ISCSI.SecretRef.Name)
		case v.FlexVolume != nil && v.FlexVolume.SecretRef != nil:
			add("flexVolume.secretRef.name", v.FlexVolume.SecretRef.Name)
		case v.ScaleIO != nil && v.ScaleIO.SecretRef != nil:
			add("scaleIO.secretRef.name", v.ScaleIO.SecretRef.Name)
		case v.StorageOS != nil && v.StorageOS.SecretRef != nil:
			add("storageos.secretRef.name", v.StorageOS.SecretRef.Name)
		}
	}
	return out
}

package admission

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/webhook/policy"
)

// recordAnnotations are the annotations of the webhook's record.
var recordAnnotations = [...]string{contract.AnnotationSpecDigest, contract.AnnotationPolicyDigest, contract.AnnotationMutations, contract.AnnotationWarnings}

// recordChanged names the first record annotation an update of a pod adds,
// removes or changes, or is "": once the webhook wrote the record at the
// pod's creation, no one may rewrite it.
func recordChanged(old, pod *corev1.Pod) string {
	for _, k := range recordAnnotations {
		was, had := old.Annotations[k]
		is, has := pod.Annotations[k]
		if had != has || was != is {
			return k
		}
	}
	return ""
}

// maxRecord bounds each recorded annotation's value.
const maxRecord = 4096

// SpecDigest is the SHA-256 of a pod spec's JSON encoding, "sha256:<hex>".
// Two pods with the same digest ran the same containers, images (by
// reference), commands, env (names and the values the spec holds),
// volumes, placement and security settings.
func SpecDigest(spec corev1.PodSpec) string {
	return specDigest(&spec)
}

// specDigest is SpecDigest without copying the spec: the encoding is
// streamed into the hash (json.Marshal's bytes, without the copy Marshal
// returns). The spec's types marshal the same by pointer as by value (no
// type in a PodSpec has a pointer-receiver MarshalJSON or MarshalText;
// TestSpecDigestIsTheSpecsJSON).
func specDigest(spec *corev1.PodSpec) string {
	h := sha256.New()
	w := heldLastByte{w: h}
	// Encode writes json.Marshal's bytes and a newline, held back here.
	if err := json.NewEncoder(&w).Encode(spec); err != nil || !w.held || w.last != '\n' {
		return ""
	}
	var sum [sha256.Size]byte
	return "sha256:" + hex.EncodeToString(h.Sum(sum[:0]))
}

// heldLastByte writes all but the last byte written to it through to w.
type heldLastByte struct {
	w    io.Writer
	last byte
	held bool
}

func (h *heldLastByte) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if h.held {
		if _, err := h.w.Write([]byte{h.last}); err != nil {
			return 0, err
		}
	}
	if _, err := h.w.Write(b[:len(b)-1]); err != nil {
		return 0, err
	}
	h.last, h.held = b[len(b)-1], true
	return len(b), nil
}

// MutationNames names what a decision's mutations change: kinds and names,
// never values, sorted.
func MutationNames(m policy.Mutations) []string {
	names := make([]string, 0, len(m.Labels)+len(m.Annotations)+len(m.NodeSelector)+len(m.Tolerations)+
		len(m.NodeAffinity)+len(m.Volumes)+len(m.Env)+len(m.EnvFrom)+len(m.VolumeMounts))
	for k := range m.Labels {
		names = append(names, "label "+k)
	}
	for k := range m.Annotations {
		names = append(names, "annotation "+k)
	}
	for k := range m.NodeSelector {
		names = append(names, "nodeSelector "+k)
	}
	for _, t := range m.Tolerations {
		names = append(names, "toleration "+t.Key)
	}
	for _, r := range m.NodeAffinity {
		names = append(names, "nodeAffinity "+r.Key)
	}
	for _, v := range m.Volumes {
		names = append(names, "volume "+v.Name)
	}
	for _, e := range m.Env {
		names = append(names, "env "+e.Env.Name)
	}
	for _, e := range m.EnvFrom {
		switch {
		case e.EnvFrom.SecretRef != nil:
			names = append(names, "envFrom secret "+e.EnvFrom.SecretRef.Name)
		case e.EnvFrom.ConfigMapRef != nil:
			names = append(names, "envFrom configMap "+e.EnvFrom.ConfigMapRef.Name)
		}
	}
	for _, v := range m.VolumeMounts {
		names = append(names, "volumeMount "+v.VolumeMount.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// record writes the webhook's record of a shaped runner pod into its
// annotations: specDigest is the SpecDigest of the spec as it leaves the
// webhook.
func record(pod *corev1.Pod, specDigest, policyDigest string, mutations, warnings []string) {
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[contract.AnnotationSpecDigest] = specDigest
	pod.Annotations[contract.AnnotationPolicyDigest] = policyDigest
	pod.Annotations[contract.AnnotationMutations] = bounded(strings.Join(mutations, ", "))
	if len(warnings) > 0 {
		pod.Annotations[contract.AnnotationWarnings] = bounded(strings.Join(warnings, "; "))
	} else {
		delete(pod.Annotations, contract.AnnotationWarnings)
	}
}

func bounded(s string) string {
	if len(s) <= maxRecord {
		return s
	}
	return s[:maxRecord-len(" [...]")] + " [...]"
}

// union is the sorted names in a or b.
func union(a, b []string) []string {
	seen := map[string]bool{}
	for _, n := range append(slices.Clone(a), b...) {
		seen[n] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

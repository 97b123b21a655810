package admission

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

// TestBoundaryHoldsInEveryMode runs the validating handler, with the
// shipped policies, under every way the platform relaxes rules (audit
// mode, a dryrun or warn default), on what crosses the credentials
// boundary: a plain pod that reads the Vault store's Secret, mounts a
// credential set's, runs as the runner service account or holds a token
// of the Vault role's audience; and a debug container that mounts a
// runner's resolved-secrets volume. Each is refused, naming its rule and
// field, never admitted with a warning; a plain pod without any of these
// is admitted, so the refusals are the boundary's and not the mode's.
func TestBoundaryHoldsInEveryMode(t *testing.T) {
	t.Parallel()
	// The start-up check refuses relaxing it, and does not take it for a
	// misspelling.
	if !policy.IsBoundaryRule(RulePlatformSecret) || !slices.Contains(policy.DecidedInGo, RulePlatformSecret) {
		t.Errorf("%s: IsBoundaryRule %v, in DecidedInGo %v; want both", RulePlatformSecret, policy.IsBoundaryRule(RulePlatformSecret), slices.Contains(policy.DecidedInGo, RulePlatformSecret))
	}
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := maps.Clone(platformConfig)
	base["secretStores"] = map[string]any{"vault": map[string]any{"enabled": true, "address": "https://vault:8200", "auth": "kubernetes", "role": "runner", "secretName": "vault-token"}}
	base["credentialSets"] = []any{map[string]any{"name": "git", "secretName": "git-creds", "mountPath": "/git"}}
	base["runner"] = map[string]any{"serviceAccount": "runner", "secrets": []any{}}
	reader := fake.NewClientBuilder().WithObjects(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tool", Namespace: "team-a"}},
		taskJob(),
	).Build()
	plain := func(change func(*corev1.PodSpec)) admission.Request {
		p := runnerPod("registry.example.com/tool:1")
		p.Labels, p.OwnerReferences, p.Spec.ServiceAccountName = map[string]string{"app": "tool"}, nil, "tool"
		p.Spec.Containers[0].Env = nil
		change(&p.Spec)
		r := request(t, p)
		r.UserInfo.Username = "alice"
		return r
	}
	debug := func() admission.Request {
		old := runnerPod("registry.example.com/runner:1")
		old.Spec.Volumes = []corev1.Volume{{Name: "runwarden-secrets", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}}
		pod := old.DeepCopy()
		pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{{TargetContainerName: "main", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debugger", Image: "registry.example.com/debug:1",
			VolumeMounts: []corev1.VolumeMount{{Name: "runwarden-secrets", MountPath: "/s"}},
		}}}
		r := request(t, pod)
		r.Operation, r.SubResource = admissionv1.Update, "ephemeralcontainers"
		r.UserInfo.Username = "alice"
		raw, err := json.Marshal(old)
		if err != nil {
			t.Fatal(err)
		}
		r.OldObject.Raw = raw
		return r
	}
	tests := []struct {
		name string
		req  admission.Request
		want []string // in the denial; none: admitted
	}{
		{name: "a plain pod with none of the platform's credentials", req: plain(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "own", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "own"}}}}
		})},
		{name: "a plain pod reading the Vault store's Secret", want: []string{"platform-secret", "spec.containers[main].env[T].valueFrom.secretKeyRef.name", `Secret "vault-token"`}, req: plain(func(s *corev1.PodSpec) {
			s.Containers[0].Env = []corev1.EnvVar{{Name: "T", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "vault-token"}, Key: "token"}}}}
		})},
		{name: "a plain pod mounting a credential set's Secret", want: []string{"platform-secret", `volume "g" reads Secret "git-creds"`}, req: plain(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "g", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "git-creds"}}}}
		})},
		{name: "a plain pod as the runner service account", want: []string{"platform-service-account", `service account "runner"`}, req: plain(func(s *corev1.PodSpec) {
			s.ServiceAccountName = "runner"
		})},
		{name: "a plain pod with a token for the Vault role", want: []string{"platform-token-audience", `audience "vault"`}, req: plain(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
				ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", ExpirationSeconds: ptr.To[int64](600), Path: "t"},
			}}}}}}
		})},
		{name: "a debug container mounting a runner's resolved values", want: []string{"no-ephemeral-containers", `ephemeral container "debugger"`}, req: debug()},
	}
	relaxed := map[string]map[string]any{
		"enforce":                     {},
		"mode audit":                  {"mode": "audit"},
		"enforcement.default dryrun":  {"enforcement": map[string]any{"default": "dryrun"}},
		"enforcement.default warn":    {"enforcement": map[string]any{"default": "warn"}},
		"audit, every rule in dryrun": {"mode": "audit", "enforcement": map[string]any{"default": "dryrun"}},
	}
	for mode, extra := range relaxed {
		cfg := maps.Clone(base)
		maps.Copy(cfg, extra)
		h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: cfg})
		for _, tt := range tests {
			t.Run(mode+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				resp := h.Handle(t.Context(), tt.req)
				if len(tt.want) == 0 {
					if !resp.Allowed {
						t.Errorf("denied (%s), want admitted", resp.Result.Message)
					}
					return
				}
				if resp.Allowed {
					t.Fatalf("admitted (warnings %q), want denied naming %q", resp.Warnings, tt.want)
				}
				for _, w := range tt.want {
					if !strings.Contains(resp.Result.Message, w) {
						t.Errorf("denial %q does not name %q", resp.Result.Message, w)
					}
				}
			})
		}
	}
}

// TestBoundaryAudienceAnnotationRefused: whoever may annotate the runner
// service account sets eks.amazonaws.com/audience to the resolver's Vault
// role's audience; the runner pod the Job controller then makes is refused
// (mutating handler, audit mode), naming the annotation, so no runner's
// main gets a token that role accepts. The platform's own IRSA audience is
// admitted and given.
func TestBoundaryAudienceAnnotationRefused(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := maps.Clone(platformConfig)
	cfg["mode"] = "audit"
	cfg["secretStores"] = map[string]any{"vault": map[string]any{"enabled": true, "address": "https://vault:8200", "auth": "kubernetes", "role": "runner"}}
	for _, tt := range []struct {
		audience string
		denied   bool
	}{{"vault", true}, {"sts.amazonaws.com", false}} {
		t.Run(tt.audience, func(t *testing.T) {
			t.Parallel()
			reader := fake.NewClientBuilder().WithObjects(
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
				&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a", Annotations: map[string]string{
					"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runner", "eks.amazonaws.com/audience": tt.audience,
				}}},
				taskJob(),
			).Build()
			h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: cfg, Mutate: true})
			resp := h.Handle(t.Context(), request(t, runnerPod("registry.example.com/runner:1")))
			if tt.denied {
				if resp.Allowed || !strings.Contains(resp.Result.Message, "identity-audience") || !strings.Contains(resp.Result.Message, "eks.amazonaws.com/audience") {
					t.Errorf("allowed %v, %q; want denied by identity-audience naming the annotation", resp.Allowed, resp.Result.Message)
				}
				return
			}
			if !resp.Allowed {
				t.Errorf("denied (%s), want admitted", resp.Result.Message)
			}
			patch, _ := json.Marshal(resp.Patches)
			if !strings.Contains(string(patch), `"audience":"sts.amazonaws.com"`) {
				t.Errorf("patch %s lacks the platform's IRSA token", patch)
			}
		})
	}
}

package admission

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

// runnerSA is the service account of runnerPod, without annotations.
func runnerSA() *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a"}}
}

// The role mapping ConfigMap as the EKS pod identity webhook's README shows
// its pod-identity-webhook ConfigMap, with runwarden's namespace.
const roleMappingConfig = `{"team-a/runner":{"RoleARN":"arn:aws:iam::123456789012:role/runner","Audience":"amazonaws.com","UseRegionalSTS":true,"TokenExpiration":0},` +
	`"myapp/myotherserviceaccount":{"RoleARN":"arn:aws:iam::123456789012:role/other","Audience":"amazonaws.com","UseRegionalSTS":true,"TokenExpiration":0},` +
	`"*/deployer":{"roleArn":"arn:aws:iam::123456789012:role/deployer","audience":"sts.amazonaws.com","tokenExpiration":3600}}`

func roleMappingCfg() map[string]any {
	return map[string]any{"workloadIdentity": map[string]any{"aws": map[string]any{
		"enabled":              true,
		"roleMappingConfigMap": map[string]any{"namespace": "kube-system", "name": "pod-identity-webhook"},
	}}}
}

func roleMappingCM(config string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pod-identity-webhook", Namespace: "kube-system"}, Data: map[string]string{"config": config}}
}

// TestRoleMappingConfigMapReachesThePolicies checks that the entries of the
// ConfigMap the platform names for the pod's service account (its own key,
// and the one for every namespace) are the policy input, field names read in
// any case as the EKS webhook reads them, and none of the others.
func TestRoleMappingConfigMapReachesThePolicies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  map[string]any
		objs []client.Object
		sa   string
		want map[string]policy.AWSRoleMapping
	}{{
		name: "its own entry",
		cfg:  roleMappingCfg(), objs: []client.Object{roleMappingCM(roleMappingConfig)}, sa: "runner",
		want: map[string]policy.AWSRoleMapping{"team-a/runner": {RoleARN: "arn:aws:iam::123456789012:role/runner", Audience: "amazonaws.com", UseRegionalSTS: true}},
	}, {
		name: "the entry for every namespace",
		cfg:  roleMappingCfg(), objs: []client.Object{roleMappingCM(roleMappingConfig)}, sa: "deployer",
		want: map[string]policy.AWSRoleMapping{"*/deployer": {RoleARN: "arn:aws:iam::123456789012:role/deployer", Audience: "sts.amazonaws.com", TokenExpiration: 3600}},
	}, {
		name: "no entry",
		cfg:  roleMappingCfg(), objs: []client.Object{roleMappingCM(roleMappingConfig)}, sa: "myotherserviceaccount",
		want: map[string]policy.AWSRoleMapping{},
	}, {
		name: "no ConfigMap: no mappings",
		cfg:  roleMappingCfg(), sa: "runner",
		want: map[string]policy.AWSRoleMapping{},
	}, {
		name: "an empty config",
		cfg:  roleMappingCfg(), objs: []client.Object{roleMappingCM("")}, sa: "runner",
		want: map[string]policy.AWSRoleMapping{},
	}, {
		name: "none named: not read",
		cfg:  map[string]any{"workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true}}}, objs: []client.Object{roleMappingCM(roleMappingConfig)}, sa: "runner",
	}, {
		name: "AWS off: not read",
		cfg:  map[string]any{"workloadIdentity": map[string]any{"aws": map[string]any{"roleMappingConfigMap": map[string]any{"namespace": "kube-system", "name": "pod-identity-webhook"}}}},
		objs: []client.Object{roleMappingCM(roleMappingConfig)}, sa: "runner",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			objs := append([]client.Object{
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
				&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: tt.sa, Namespace: "team-a"}},
			}, tt.objs...)
			pod := runnerPod("registry.example.com/runner:1")
			pod.Spec.ServiceAccountName = tt.sa
			in, _, err := BuildInput(t.Context(), ClusterLookups(fake.NewClientBuilder().WithObjects(objs...).Build(), nil), pod, "CREATE", jobController, nil, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, in.AWSRoleMappings); diff != "" {
				t.Errorf("role mappings (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRoleMappingGivesTheRunnerItsRole checks the whole way: a service
// account without annotations, mapped by the ConfigMap, gets its role in the
// runner pod.
func TestRoleMappingGivesTheRunnerItsRole(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithObjects(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, runnerSA(), taskJob(), roleMappingCM(roleMappingConfig),
	).Build()
	h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: roleMappingCfg(), Mutate: true})
	pod := runnerPod("registry.example.com/runner:1")
	pod.Spec.Containers[0].Env = nil
	resp := h.Handle(t.Context(), request(t, pod))
	if !resp.Allowed {
		t.Fatalf("refused: %+v", resp.Result)
	}
	got := mutatedPod(t, pod, resp)
	env := map[string]string{}
	for _, e := range got.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	want := map[string]string{
		"AWS_ROLE_ARN":                "arn:aws:iam::123456789012:role/runner",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
		"AWS_STS_REGIONAL_ENDPOINTS":  "regional",
	}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("runner env (-want +got):\n%s", diff)
	}
}

// TestMalformedRoleMappingRefusesThePod checks that a ConfigMap whose
// mappings cannot be read refuses the pod with an error naming it (the Job
// controller retries), rather than admitting it without its role.
func TestMalformedRoleMappingRefusesThePod(t *testing.T) {
	t.Parallel()
	for name, config := range map[string]string{
		"not JSON":        `{"team-a/runner":`,
		"not an object":   `["team-a/runner"]`,
		"a key without /": `{"runner":{"RoleARN":"arn:aws:iam::1:role/r"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			reader := fake.NewClientBuilder().WithObjects(
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, runnerSA(), taskJob(), roleMappingCM(config),
			).Build()
			h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: roleMappingCfg(), Mutate: true})
			resp := h.Handle(t.Context(), request(t, runnerPod("registry.example.com/runner:1")))
			if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusInternalServerError ||
				!strings.Contains(resp.Result.Message, "the role mapping ConfigMap kube-system/pod-identity-webhook, key config, cannot be read") {
				t.Errorf("allowed %v, result %+v; want a 500 naming the ConfigMap", resp.Allowed, resp.Result)
			}
		})
	}
}

// TestMissingServiceAccountRefusesThePod checks that a pod whose service
// account cannot be read (neither the cache nor the API server holds it) is
// refused with an error the Job controller retries, not admitted without
// the identity its service account would give, as Azure's webhook refuses
// it; an update of a pod whose service account has gone is still checked.
func TestMissingServiceAccountRefusesThePod(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, taskJob()).Build()
	for _, mutate := range []bool{true, false} {
		h := New(Options{Policies: staticPolicies{set}, Reader: CacheThenLive(reader, reader), Jobs: reader, Config: platformConfig, Mutate: mutate})
		resp := h.Handle(t.Context(), request(t, runnerPod("registry.example.com/runner:1")))
		if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusInternalServerError ||
			!strings.Contains(resp.Result.Message, "service account team-a/runner could not be read, so the pod's workload identity is unknown") {
			t.Errorf("mutate %v: allowed %v, result %+v; want a 500 saying the service account could not be read", mutate, resp.Allowed, resp.Result)
		}
	}

	pod := runnerPod("registry.example.com/runner:1")
	in, _, err := BuildInput(t.Context(), ClusterLookups(reader, nil), pod, "UPDATE", jobController, nil, platformConfig)
	if err != nil {
		t.Fatalf("an update without the service account: %v", err)
	}
	if diff := cmp.Diff(policy.ObjectInfo{Name: "runner", Annotations: map[string]string{}}, in.ServiceAccount); diff != "" {
		t.Errorf("service account (-want +got):\n%s", diff)
	}
}

// TestPodIdentityMountPathTakenRefusesThePod checks that a runner container
// that already mounts another volume where EKS Pod Identity's token goes
// makes the pod refused, naming both volumes, as the API server would
// refuse it for the duplicate mount path (the EKS webhook adds its mount
// regardless); one that mounts a volume of the token's name keeps its own.
func TestPodIdentityMountPathTakenRefusesThePod(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, runnerSA(), taskJob()).Build()
	cfg := map[string]any{"workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true, "podIdentity": map[string]any{
		"associations": []any{map[string]any{"namespace": "team-a", "serviceAccount": "runner"}},
	}}}}
	h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: cfg, Mutate: true})
	const path = "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount"
	tests := []struct {
		name, volume, refusal string
	}{
		{name: "another volume at the token's path", volume: "own", refusal: "container main already mounts volume own at " + path + ", where the platform mounts eks-pod-identity-token"},
		{name: "the token's volume name", volume: "eks-pod-identity-token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pod := runnerPod("registry.example.com/runner:1")
			pod.Spec.Containers[0].Env = nil
			pod.Spec.Volumes = []corev1.Volume{{Name: tt.volume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: tt.volume, MountPath: path}}
			resp := h.Handle(t.Context(), request(t, pod))
			if tt.refusal != "" {
				if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, tt.refusal) {
					t.Errorf("allowed %v, result %+v; want refused: %s", resp.Allowed, resp.Result, tt.refusal)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			got := mutatedPod(t, pod, resp)
			if diff := cmp.Diff(pod.Spec.Containers[0].VolumeMounts, got.Spec.Containers[0].VolumeMounts); diff != "" {
				t.Errorf("the container's mounts changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(pod.Spec.Volumes, got.Spec.Volumes); diff != "" {
				t.Errorf("the pod's volumes changed (-before +after):\n%s", diff)
			}
			if env := containerEnvMap(got.Spec.Containers[0]); env["AWS_CONTAINER_CREDENTIALS_FULL_URI"] != "http://169.254.170.23/v1/credentials" {
				t.Errorf("env %v, want Pod Identity's variables still set", env)
			}
		})
	}
}

func containerEnvMap(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// identityRunnerJob is a runner Job as the dispatcher makes it (its labels),
// whose one pod runs script in the runner image on the real node as service
// account sa.
func identityRunnerJob(ctx context.Context, t *testing.T, ns, name, sa, script string) *batchv1.Job {
	t.Helper()
	job := realJob(ctx, t, ns, name, script)
	job.Labels = map[string]string{"runwarden.dev/dispatcher": "e2e"}
	job.Spec.Template.Labels["runwarden.dev/runner"] = "true"
	job.Spec.Template.Spec.ServiceAccountName = sa
	return job
}

// printToken prints the JWT payload of the token file $TOKEN_FILE names (base64url,
// padded for busybox's base64), then the AWS variables the pod got.
const printToken = `
p=$(cut -d. -f2 "$TOKEN_FILE" | tr '_-' '/+')
case $(( ${#p} % 4 )) in 2) p="$p==";; 3) p="$p=";; esac
echo "$p" | base64 -d; echo
echo "uri=${AWS_CONTAINER_CREDENTIALS_FULL_URI:-none}"
echo "role=${AWS_ROLE_ARN:-none}"
`

// tokenClaims reads what printToken printed: the token's claims and the
// variables.
func tokenClaims(t *testing.T, logs string) (aud []string, sub string, vars map[string]string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	if len(lines) != 3 {
		t.Fatalf("logs %q, want the token's payload and two variables", logs)
	}
	var claims struct {
		Aud []string `json:"aud"`
		Sub string   `json:"sub"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &claims); err != nil {
		t.Fatalf("the token's payload %q: %v", lines[0], err)
	}
	vars = map[string]string{}
	for _, l := range lines[1:] {
		k, v, _ := strings.Cut(l, "=")
		vars[k] = v
	}
	return claims.Aud, claims.Sub, vars
}

// TestPodIdentityTokenFromTheKubelet runs runner pods on the real node with
// the webhook registered by URL: a pod whose service account the platform
// associates (EKS Pod Identity) reads, from the file its
// AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE names, a token the kubelet wrote
// for audience pods.eks.amazonaws.com and its service account, and gets no
// IRSA variables; a pod whose service account only the role mapping
// ConfigMap maps (the webhook's informer on that one ConfigMap) gets that
// role and a web identity token of the entry's audience.
func TestPodIdentityTokenFromTheKubelet(t *testing.T) {
	t.Parallel()
	f := features.New("EKS Pod Identity and the role mapping ConfigMap on the real node").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			ns := harness.Namespace(ctx)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			r := cfg.Client().Resources()
			mapping := fmt.Sprintf(`{"%s/mapped":{"RoleARN":"arn:aws:iam::111122223333:role/mapped","Audience":"sts.example.com","UseRegionalSTS":false,"TokenExpiration":0}}`, ns)
			for _, obj := range []client.Object{
				&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "associated", Namespace: ns, Annotations: map[string]string{
					// An association wins over a role.
					"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/annotated",
				}}},
				&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "mapped", Namespace: ns}},
				&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "pod-identity-webhook", Namespace: ns}, Data: map[string]string{"config": mapping}},
			} {
				if err := r.Create(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}
			return ctx
		}).
		Assess("the kubelet's token has Pod Identity's audience; the ConfigMap's role is given", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			w := startWebhookWith(ctx, t, cfg, fmt.Sprintf(`
workloadIdentity:
  aws:
    enabled: true
    podIdentity: {associations: [{namespace: %[1]s, serviceAccount: associated}]}
    roleMappingConfigMap: {namespace: %[1]s, name: pod-identity-webhook}
`, ns))

			job := identityRunnerJob(ctx, t, ns, "pod-identity", "associated", "TOKEN_FILE=$AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"+printToken)
			pod, logs := runToCompletion(ctx, t, cfg, job)
			if pod.Labels["eks.amazonaws.com/pod-identity"] != "enabled" {
				t.Errorf("pod labels %v, want eks.amazonaws.com/pod-identity: enabled\nwebhook log:\n%s", pod.Labels, w.log.String())
			}
			if env := envOf(&pod); env["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"] != "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token" {
				t.Errorf("pod env %v, want the Pod Identity token file", env)
			}
			aud, sub, vars := tokenClaims(t, logs)
			if !slices.Equal(aud, []string{"pods.eks.amazonaws.com"}) || sub != "system:serviceaccount:"+ns+":associated" {
				t.Errorf("token aud %v sub %q, want [pods.eks.amazonaws.com] and the pod's service account", aud, sub)
			}
			if want := map[string]string{"uri": "http://169.254.170.23/v1/credentials", "role": "none"}; !maps.Equal(vars, want) {
				t.Errorf("variables %v, want %v", vars, want)
			}

			job = identityRunnerJob(ctx, t, ns, "role-mapping", "mapped", "TOKEN_FILE=$AWS_WEB_IDENTITY_TOKEN_FILE"+printToken)
			_, logs = runToCompletion(ctx, t, cfg, job)
			aud, sub, vars = tokenClaims(t, logs)
			if !slices.Equal(aud, []string{"sts.example.com"}) || sub != "system:serviceaccount:"+ns+":mapped" {
				t.Errorf("token aud %v sub %q, want [sts.example.com] and the pod's service account", aud, sub)
			}
			if want := map[string]string{"uri": "none", "role": "arn:aws:iam::111122223333:role/mapped"}; !maps.Equal(vars, want) {
				t.Errorf("variables %v, want %v\nwebhook log:\n%s", vars, want, w.log.String())
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

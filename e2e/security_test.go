//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/e2e/harness"
)

// The attacks of docs/security.md, each run on the real API server as a user
// holding only the RBAC its actor has, each showing the message that user
// sees.

// taskAuthor is a user who may only write RunnerTasks in one namespace:
// what a platform grants the teams that submit tasks.
func taskAuthor(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string) harness.User {
	t.Helper()
	u := harness.User{Name: "task-author-" + ns[len(ns)-6:]}
	if err := u.Grant(ctx, cfg, ns, "task-author", rbacv1.PolicyRule{
		APIGroups: []string{"runwarden.dev"}, Resources: []string{"runnertasks"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
	}); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestSecurityTaskEnvIsData: a task author cannot make the dispatcher's Job
// read a Secret, a ConfigMap or a mounted file into the task's env; the
// RunnerTask CRD refuses it with a message naming the variables.
func TestSecurityTaskEnvIsData(t *testing.T) {
	f := features.New("task env is data").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("the CRD refuses env read from cluster objects", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			c, err := taskAuthor(ctx, t, cfg, ns).Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			sources := map[string]*corev1.EnvVarSource{
				"secretKeyRef":    {SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}, Key: "aws_secret_access_key"}},
				"configMapKeyRef": {ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "platform"}, Key: "k"}},
				"fileKeyRef":      {FileKeyRef: &corev1.FileKeySelector{VolumeName: "aws-iam-token", Path: "token", Key: "token"}},
			}
			for field, src := range sources {
				rt := runnerTask(ns, "steal-"+strings.ToLower(field), "env")
				rt.Spec.Env = append(rt.Spec.Env, corev1.EnvVar{Name: "STOLEN", ValueFrom: src})
				err := c.Create(ctx, rt)
				if err == nil || !strings.Contains(err.Error(), "env STOLEN: a task variable carries a value") ||
					!strings.Contains(err.Error(), "secretKeyRef, configMapKeyRef and fileKeyRef are refused") {
					t.Errorf("RunnerTask with env valueFrom.%s: error %v, want the CRD's refusal naming STOLEN", field, err)
				}
			}
			own := runnerTask(ns, "own-fields", "env")
			own.Spec.Env = append(own.Spec.Env,
				corev1.EnvVar{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				corev1.EnvVar{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}})
			if err := c.Create(ctx, own); err != nil {
				t.Errorf("RunnerTask with env from the pod's own fields: %v", err)
			}
			var got v1alpha1.RunnerTaskList
			if err := c.List(ctx, &got, client.InNamespace(ns)); err != nil || len(got.Items) != 1 {
				t.Errorf("the task author sees %d RunnerTasks (%v), want only own-fields", len(got.Items), err)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

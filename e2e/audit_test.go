//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/e2e/harness"
	"github.com/runwarden/runwarden/webhook/audit"
)

// policyReportGVK is the PolicyReport's kind.
var policyReportGVK = schema.GroupVersionKind{Group: "wgpolicyk8s.io", Version: "v1alpha2", Kind: "PolicyReport"}

// installReportObjects creates what the chart installs with
// policyReports.enabled that the webhook process needs from the cluster:
// the PolicyReport CRD (kept: other tests may have it) and the ClusterRole
// aggregated into view (deleted at the end), rendered by Helm from the
// chart itself. The ClusterRole is the release's, and the release is named
// after the feature's namespace, so tests beside this one never share it.
func installReportObjects(ctx context.Context, t *testing.T, cfg *envconf.Config) {
	t.Helper()
	ns := harness.Namespace(ctx)
	h := newHelm(t, cfg, "helm3")
	out, err := h.run(ctx, "template", "rw-"+ns[len(ns)-6:], filepath.Join(suite.RepoRoot, "charts", "runwarden"), "--namespace", "runwarden",
		"--set", "policyReports.enabled=true", "--show-only", "templates/policyreports.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, doc := range strings.Split(out, "\n---\n") {
		switch {
		case strings.Contains(doc, "kind: CustomResourceDefinition"):
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				t.Fatal(err)
			}
			if err := cfg.Client().Resources().Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("creating the PolicyReport CRD: %v", err)
			}
		case strings.Contains(doc, "kind: ClusterRole\n"):
			keep = append(keep, doc)
		}
	}
	if len(keep) != 1 {
		t.Fatalf("the chart rendered %d ClusterRoles for the reports, want 1:\n%s", len(keep), out)
	}
	applyObjects(ctx, t, cfg, keep[0])
	served := func(ctx context.Context) (bool, error) {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(policyReportGVK.GroupVersion().WithKind("PolicyReportList"))
		err := cfg.Client().Resources().GetControllerRuntimeClient().List(ctx, &list, client.InNamespace("default"))
		return err == nil, nil
	}
	if err := harness.WaitFor(ctx, "the PolicyReport API to be served", time.Minute, served); err != nil {
		t.Fatal(err)
	}
}

// impersonatingKubeconfig writes a kubeconfig that acts as user, from the
// suite's: what a CI job with its own narrow credentials has.
func impersonatingKubeconfig(t *testing.T, cfg *envconf.Config, user string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(cfg.KubeconfigFile())
	if err != nil {
		t.Fatal(err)
	}
	ctxName := kc.CurrentContext
	ai := kc.AuthInfos[kc.Contexts[ctxName].AuthInfo].DeepCopy()
	ai.Impersonate = user
	ai.ImpersonateGroups = []string{"system:authenticated"}
	kc.AuthInfos["as-"+user] = ai
	kc.Contexts[ctxName].AuthInfo = "as-" + user
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// runAudit runs policy audit and returns its exit status and output.
func runAudit(ctx context.Context, t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, append([]string{"policy", "audit"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("running policy audit: %v", err)
	return 0, "", ""
}

// TestPolicyAudit runs tasks under the set in force, then audits a
// candidate set that adds a rule against the cluster: it names exactly the
// pods the rule would deny and exits 3; a user who may not list Jobs is
// told so. The webhook's PolicyReport lists the tasks' results, and a user
// who may only view the namespace reads it, and cannot change it.
func TestPolicyAudit(t *testing.T) {
	t.Parallel()
	f := features.New("policy audit and reports").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: ns}}
			if err := cfg.Client().Resources().Create(ctx, sa); err != nil {
				t.Fatal(err)
			}
			installReportObjects(ctx, t, cfg)
			return ctx
		}).
		Assess("audit names the pods a new rule denies; the report lists the tasks and a viewer reads it", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			w := startWebhook(ctx, t, cfg, "--runner-namespace", ns, "--pod-name", "webhook-e2e", "--pod-namespace", ns,
				"--policy-reports", "--policy-report-interval", "1s")

			// Tasks under the set in force: two run with DEBUG set.
			var debugPods, allPods []string
			for _, task := range []struct {
				name  string
				debug bool
			}{{"audit-a", true}, {"audit-b", false}, {"audit-c", true}} {
				j := runnerJobFor(ns, task.name, false)
				if task.debug {
					c := &j.Spec.Template.Spec.Containers[0]
					c.Env = append(c.Env, corev1.EnvVar{Name: "DEBUG", Value: "1"})
				}
				pod, failure := jobPod(ctx, t, cfg, j)
				if pod == nil {
					t.Fatalf("task %s got no pod under the set in force: %s\nwebhook log:\n%s", task.name, failure, w.log.String())
				}
				allPods = append(allPods, pod.Name)
				if task.debug {
					debugPods = append(debugPods, pod.Name)
				}
			}
			slices.Sort(debugPods)
			slices.Sort(allPods)

			candidate := t.TempDir()
			if err := os.CopyFS(candidate, os.DirFS(w.policyDir)); err != nil {
				t.Fatal(err)
			}
			rule, err := os.ReadFile(filepath.Join(suite.RepoRoot, "webhook", "audit", "testdata", "candidate.rego"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(candidate, "candidate.rego"), rule, 0o644); err != nil {
				t.Fatal(err)
			}
			resolver, err := suite.ImageRef(ctx, "webhook")
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"--policies", candidate, "--current", w.policyDir, "--config", w.platform, "--against-cluster",
				"--namespaces", ns, "--resolver-image", resolver, "-o", "json"}

			code, stdout, stderr := runAudit(ctx, t, w.bin, append(args, "--kubeconfig", cfg.KubeconfigFile())...)
			if code != 3 {
				t.Fatalf("policy audit exited %d, want 3 (new denials)\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
			}
			var cmpr audit.Comparison
			if err := json.Unmarshal([]byte(stdout), &cmpr); err != nil {
				t.Fatalf("policy audit -o json: %v\n%s", err, stdout)
			}
			var denied []string
			for _, rc := range cmpr.Rules {
				if rc.Rule != "no-debug-env" || rc.List != audit.ListDeny || len(rc.Removed) > 0 {
					t.Errorf("unexpected rule change %+v: only no-debug-env should deny anew", rc)
				}
				for _, ref := range rc.Added {
					denied = append(denied, ref.Name)
				}
			}
			slices.Sort(denied)
			if diff := cmp.Diff(debugPods, denied); diff != "" {
				t.Errorf("pods no-debug-env would deny (-the tasks' pods with DEBUG +audit):\n%s", diff)
			}
			if cmpr.NewDenials() != len(debugPods) || len(cmpr.Diffs) != len(allPods) {
				t.Errorf("audited %d pods with %d new denials, want %d and %d", len(cmpr.Diffs), cmpr.NewDenials(), len(allPods), len(debugPods))
			}
			if code, _, _ := runAudit(ctx, t, w.bin, append(args, "--kubeconfig", cfg.KubeconfigFile(), "--allow-new-denials")...); code != 0 {
				t.Errorf("with --allow-new-denials policy audit exited %d, want 0", code)
			}

			// A user who may list pods but not Jobs is told what is missing.
			auditor := harness.User{Name: "auditor-" + ns[len(ns)-6:]}
			if err := auditor.Grant(ctx, cfg, ns, "auditor", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}); err != nil {
				t.Fatal(err)
			}
			code, _, stderr = runAudit(ctx, t, w.bin, append(args, "--kubeconfig", impersonatingKubeconfig(t, cfg, auditor.Name))...)
			if code != 1 || !strings.Contains(stderr, "forbidden: this user may not list jobs.batch in namespace "+ns) || strings.Contains(stderr, "list pods") {
				t.Errorf("as a user without list on Jobs: exit %d, stderr %q; want 1 naming list jobs.batch in %s and not pods", code, stderr, ns)
			}

			// The report, as a user bound to view in the namespace.
			viewer := harness.User{Name: "viewer-" + ns[len(ns)-6:]}
			rb := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "viewer", Namespace: ns},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: viewer.Name}},
			}
			if err := cfg.Client().Resources().Create(ctx, rb); err != nil {
				t.Fatal(err)
			}
			vc, err := viewer.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			report := &unstructured.Unstructured{}
			var lastErr error
			listed := func(ctx context.Context) (bool, error) {
				report.SetGroupVersionKind(policyReportGVK)
				lastErr = vc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "runwarden"}, report)
				if lastErr != nil {
					return false, nil
				}
				return slices.Equal(reportPods(report), allPods), nil
			}
			if err := harness.WaitFor(ctx, "the viewer to read a PolicyReport listing the tasks' pods", 90*time.Second, listed); err != nil {
				t.Fatalf("%v (last: %v, report pods %v)\nwebhook log:\n%s", err, lastErr, reportPods(report), w.log.String())
			}
			checkReport(t, report)
			if err := vc.Delete(ctx, report); !apierrors.IsForbidden(err) {
				t.Errorf("the viewer deleting the report: %v, want forbidden", err)
			}
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: viewer.Name, Groups: []string{"system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "patch", Group: "wgpolicyk8s.io", Resource: "policyreports", Name: "runwarden"},
			}}
			if err := cfg.Client().Resources().Create(ctx, review); err != nil || review.Status.Allowed {
				t.Errorf("the viewer may patch the report (%v): want no", err)
			}
			var lease coordinationv1.Lease
			if err := cfg.Client().Resources(ns).Get(ctx, "runwarden-webhook-policy-reports", ns, &lease); err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
				t.Errorf("the reports' Lease: %v, holder %v; want one held by the webhook", err, lease.Spec.HolderIdentity)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// reportPods are the pods a report's results name, sorted, once each.
func reportPods(r *unstructured.Unstructured) []string {
	results, _, _ := unstructured.NestedSlice(r.Object, "results")
	var pods []string
	for _, res := range results {
		m, _ := res.(map[string]any)
		refs, _, _ := unstructured.NestedSlice(m, "resources")
		for _, ref := range refs {
			name, _, _ := unstructured.NestedString(ref.(map[string]any), "name")
			if !slices.Contains(pods, name) {
				pods = append(pods, name)
			}
		}
	}
	slices.Sort(pods)
	return pods
}

// checkReport checks the report's results: all pass under the set in
// force, one per rule and pod, counted in the summary, policy runwarden.
func checkReport(t *testing.T, r *unstructured.Unstructured) {
	t.Helper()
	results, _, _ := unstructured.NestedSlice(r.Object, "results")
	counts := map[string]int64{}
	rules := map[string]int{}
	for _, res := range results {
		m := res.(map[string]any)
		counts[m["result"].(string)]++
		rules[m["rule"].(string)]++
		if m["policy"] != "runwarden" {
			t.Errorf("result %v: policy %v, want runwarden", m["rule"], m["policy"])
		}
	}
	if counts["pass"] == 0 || counts["fail"] != 0 {
		t.Errorf("results %v: want every rule passed by the tasks' pods", counts)
	}
	for rule, n := range rules {
		if n != 3 {
			t.Errorf("rule %s has %d results, want one per pod (3)", rule, n)
		}
	}
	pass, _, _ := unstructured.NestedInt64(r.Object, "summary", "pass")
	if pass != counts["pass"] {
		t.Errorf("summary.pass %d, results passed %d", pass, counts["pass"])
	}
}

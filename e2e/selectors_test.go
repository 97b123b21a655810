//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/e2e/harness"
)

// renderChart runs helm template of the checkout's chart as release in
// namespace releaseNS, with args, and returns the objects it renders.
func renderChart(ctx context.Context, t *testing.T, cfg *envconf.Config, release, releaseNS string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := newHelm(t, cfg, "helm4").run(ctx, append([]string{"template", release, filepath.Join(suite.RepoRoot, "charts", "runwarden"), "--namespace", releaseNS}, args...)...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(out, "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil || obj.GetKind() == "" {
			continue
		}
		objs = append(objs, obj)
	}
	return objs
}

// useChartNamespaceSelectors gives w's two webhook configurations the
// namespaceSelector the chart renders for runner namespace ns (they are
// otherwise the e2e suite's copy of the chart's). The API server takes
// them up a moment later: newLabelProbe tells when.
func useChartNamespaceSelectors(ctx context.Context, t *testing.T, cfg *envconf.Config, w *webhookProcess, ns string) {
	t.Helper()
	selectors := map[string]*metav1.LabelSelector{}
	for _, obj := range renderChart(ctx, t, cfg, "rel", "runwarden", "--set", "runnerNamespace="+ns, "--show-only", "templates/webhook.yaml") {
		if obj.GetKind() != "MutatingWebhookConfiguration" && obj.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		hooks, _, _ := unstructured.NestedSlice(obj.Object, "webhooks")
		if len(hooks) != 1 {
			t.Fatalf("the chart's %s has %d webhooks, want 1", obj.GetKind(), len(hooks))
		}
		b, err := yaml.Marshal(hooks[0].(map[string]any)["namespaceSelector"])
		if err != nil {
			t.Fatal(err)
		}
		sel := &metav1.LabelSelector{}
		if err := yaml.Unmarshal(b, sel); err != nil {
			t.Fatal(err)
		}
		selectors[obj.GetKind()] = sel
	}
	if len(selectors) != 2 {
		t.Fatalf("the chart renders namespace selectors for %v, want both webhook configurations", selectors)
	}
	r := cfg.Client().Resources()
	// The webhook patches its CA into the configurations meanwhile.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := r.Get(ctx, w.config, "", m); err != nil {
			return err
		}
		m.Webhooks[0].NamespaceSelector = selectors["MutatingWebhookConfiguration"]
		return r.Update(ctx, m)
	})
	if err != nil {
		t.Fatalf("the mutating configuration's namespaceSelector: %v", err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := r.Get(ctx, w.config, "", v); err != nil {
			return err
		}
		v.Webhooks[0].NamespaceSelector = selectors["ValidatingWebhookConfiguration"]
		return r.Update(ctx, v)
	})
	if err != nil {
		t.Fatalf("the validating configuration's namespaceSelector: %v", err)
	}
}

// labelProbe is a pair of webhook configurations (one mutating, one
// validating) that call nothing (127.0.0.1:1) and fail closed, for
// ConfigMaps labelled with its own label, in namespace ns while it carries
// runnerNamespaceLabel. The API server reads webhook configurations and
// namespaces from its informers, each of which applies events in order:
// once a probe made after a change of a configuration is called, that
// change is in force; once a probe stops being called for a namespace
// whose label was removed, the webhooks' namespace selectors see the
// namespace without it.
type labelProbe struct {
	name string
	ns   string
}

func newLabelProbe(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string) labelProbe {
	t.Helper()
	p := labelProbe{name: "probe-" + ns, ns: ns}
	sel := &metav1.LabelSelector{
		MatchLabels:      map[string]string{runnerNamespaceLabel: "enabled"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{ns}}},
	}
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
	}}
	hook := func(kind string) (admissionregistrationv1.WebhookClientConfig, *metav1.LabelSelector) {
		return admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/" + kind)},
			&metav1.LabelSelector{MatchLabels: map[string]string{"e2e.runwarden.dev/probe": kind}}
	}
	mc, mo := hook("mutating")
	vc, vo := hook("validating")
	objs := []k8s.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: p.name}, Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "probe.e2e.runwarden.dev", ClientConfig: mc, Rules: rules, ObjectSelector: mo, NamespaceSelector: sel,
			FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds: ptr.To[int32](2), AdmissionReviewVersions: []string{"v1"},
		}}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: p.name}, Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "probe.e2e.runwarden.dev", ClientConfig: vc, Rules: rules, ObjectSelector: vo, NamespaceSelector: sel,
			FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds: ptr.To[int32](2), AdmissionReviewVersions: []string{"v1"},
		}}},
	}
	for _, o := range objs {
		if err := cfg.Client().Resources().Create(ctx, o); err != nil {
			t.Fatalf("creating the probe configuration: %v", err)
		}
		t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), o) })
	}
	return p
}

// called reports whether both probes are called now (a dry run of a
// ConfigMap for each fails calling it), and notCalled whether neither is.
func (p labelProbe) called(ctx context.Context, cfg *envconf.Config) (bool, error) {
	calls, err := p.calls(ctx, cfg)
	return calls[0] && calls[1], err
}

func (p labelProbe) notCalled(ctx context.Context, cfg *envconf.Config) (bool, error) {
	calls, err := p.calls(ctx, cfg)
	return !calls[0] && !calls[1], err
}

// calls is whether the mutating and the validating probe are called.
func (p labelProbe) calls(ctx context.Context, cfg *envconf.Config) ([2]bool, error) {
	var calls [2]bool
	for i, kind := range []string{"mutating", "validating"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: p.ns, Labels: map[string]string{"e2e.runwarden.dev/probe": kind}}}
		err := cfg.Client().Resources().Create(ctx, cm, func(o *metav1.CreateOptions) { o.DryRun = []string{metav1.DryRunAll} })
		switch {
		case err == nil:
		case strings.Contains(err.Error(), "failed calling webhook \"probe.e2e.runwarden.dev\""):
			calls[i] = true
		default:
			return calls, fmt.Errorf("probe %s: %w", kind, err)
		}
	}
	return calls, nil
}

// TestSecurityNamespaceLabelIsNoSwitch: a user of the runner namespace who
// may patch the Namespace object itself (a Role there with patch on
// namespaces) removes its label runwarden.dev/runners, which the webhook
// configurations once selected it by; the webhooks select it by name
// (kubernetes.io/metadata.name, set and kept by the API server) and every
// check goes on: the same user's pod claiming the runner label, privileged
// pod, exec into a runner pod and change of a runner pod's label are each
// refused, and a runner Job's pod is still shaped (its resolver holds the
// store's credentials). The webhook runs with the chart's namespace
// selectors, rendered from the checkout.
func TestSecurityNamespaceLabelIsNoSwitch(t *testing.T) {
	t.Parallel()
	f := features.New("namespace label").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			// As the chart once labelled the runner namespace.
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: harness.Namespace(ctx)}}
			if err := cfg.Client().Resources().Create(ctx, sa); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("with the label removed, every check goes on", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			w := startWebhookWith(ctx, t, cfg, securityPlatformConfig)
			useChartNamespaceSelectors(ctx, t, cfg, w, ns)
			probe := newLabelProbe(ctx, t, cfg, ns)
			called := func(ctx context.Context) (bool, error) { return probe.called(ctx, cfg) }
			if err := harness.WaitFor(ctx, "the chart's selectors, then the probe, to be in force", time.Minute, called); err != nil {
				t.Fatal(err)
			}

			u := harness.User{Name: "ns-labeller-" + ns[len(ns)-6:]}
			if err := u.Grant(ctx, cfg, ns, "namespace-patcher", rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{ns}, Verbs: []string{"patch", "get"},
			}, rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "create", "patch"},
			}, rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"create", "get"},
			}); err != nil {
				t.Fatal(err)
			}
			c, err := u.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			unlabel := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+runnerNamespaceLabel+`":null}}}`))
			if err := c.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, unlabel); err != nil {
				t.Fatalf("%s removing the label %s from namespace %s: %v", u.Name, runnerNamespaceLabel, ns, err)
			}
			gone := func(ctx context.Context) (bool, error) { return probe.notCalled(ctx, cfg) }
			if err := harness.WaitFor(ctx, "the API server to see namespace "+ns+" without the label", time.Minute, gone); err != nil {
				t.Fatal(err)
			}

			withImage := func(p *corev1.Pod) *corev1.Pod {
				p.Spec.Containers[0].Image = "registry.example.com/runner:1"
				return p
			}
			if err := c.Create(ctx, withImage(runnerPodFor(ns, "bare-claim", false))); err == nil ||
				!strings.Contains(err.Error(), `claims the label runwarden.dev/runner: "true"`) {
				t.Errorf("a pod claiming the runner label, with the namespace unlabelled: %v; want it refused by the earned check", err)
			}
			privileged := withImage(runnerPodFor(ns, "privileged-plain", true))
			privileged.Labels = map[string]string{"app": "tool"}
			if err := c.Create(ctx, privileged); err == nil || !strings.Contains(err.Error(), "no-privileged") {
				t.Errorf("a privileged pod, with the namespace unlabelled: %v; want it refused by no-privileged", err)
			}

			// A runner Job made after the label went: its pod is shaped.
			j := runnerJobFor(ns, "runner-after", false)
			j.Spec.Template.Spec.Containers[0].Image = "registry.example.com/runner:1"
			runner, failure := jobPod(ctx, t, cfg, j)
			if runner == nil {
				t.Fatalf("the runner Job's pod: %s\nwebhook log:\n%s", failure, w.log.String())
			}
			if len(runner.Spec.InitContainers) == 0 || containerEnv(runner.Spec.InitContainers[0])["VAULT_TOKEN"] == "" {
				t.Errorf("the runner pod made with the namespace unlabelled was not shaped (no resolver with the store's credentials): %+v", runner.Spec.InitContainers)
			}

			// exec into it: the CONNECT is refused at admission, before the
			// API server would reach the node.
			rc := rest.CopyConfig(cfg.Client().RESTConfig())
			rc.Impersonate = rest.ImpersonationConfig{UserName: u.Name, Groups: []string{"system:authenticated"}}
			cs, err := kubernetes.NewForConfig(rc)
			if err != nil {
				t.Fatal(err)
			}
			err = cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(runner.Name).SubResource("exec").
				VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"cat", "/proc/1/environ"}, Stdout: true}, scheme.ParameterCodec).
				Do(ctx).Error()
			if err == nil || !strings.Contains(err.Error(), "no-exec-into-runners: exec into runner pod "+runner.Name) {
				t.Errorf("exec into runner pod %s, with the namespace unlabelled: %v; want it refused by no-exec-into-runners", runner.Name, err)
			}

			// The update guard: the runner label cannot come off.
			off := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"runwarden.dev/runner":"false"}}}`))
			if err := c.Patch(ctx, runner.DeepCopy(), off); err == nil || !strings.Contains(err.Error(), `admission webhook "pods.runwarden.dev" denied the request`) {
				t.Errorf("taking the runner label off a runner pod, with the namespace unlabelled: %v; want it refused", err)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityLeasesAreTheirOwn: the dispatcher's and the webhook's service
// accounts, each with exactly the chart's Roles in the release namespace
// (which let each create any Lease: create cannot be limited by name),
// cannot create each other's Lease first, nor any Lease but their own: the
// chart's leases policy refuses it, naming theirs. Each creates, reads and
// renews its own; neither may update the other's.
func TestSecurityLeasesAreTheirOwn(t *testing.T) {
	t.Parallel()
	f := features.New("leases").
		Assess("each service account creates only its own Lease", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			release := "lz-" + ns[len(ns)-6:]
			fullname := release + "-runwarden"
			objs := renderChart(ctx, t, cfg, release, ns, "--set", "runnerNamespace="+ns+"-runners", "--set", "policyReports.enabled=true",
				"--show-only", "templates/leases-policy.yaml", "--show-only", "templates/rbac.yaml", "--show-only", "templates/policyreports.yaml")
			wanted := map[string]bool{
				"Role/" + fullname + "-dispatcher-leader": true, "RoleBinding/" + fullname + "-dispatcher-leader": true,
				"Role/" + fullname + "-webhook-reports-lease": true, "RoleBinding/" + fullname + "-webhook-reports-lease": true,
				"ValidatingAdmissionPolicy/" + fullname + "-leases": true, "ValidatingAdmissionPolicyBinding/" + fullname + "-leases": true,
			}
			for _, obj := range objs {
				key := obj.GetKind() + "/" + obj.GetName()
				if !wanted[key] {
					continue
				}
				delete(wanted, key)
				if err := cfg.Client().Resources().Create(ctx, obj); err != nil {
					t.Fatalf("creating %s: %v", key, err)
				}
				if obj.GetNamespace() == "" {
					t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), obj) })
				}
			}
			if len(wanted) > 0 {
				t.Fatalf("the chart renders none of %v", wanted)
			}
			serviceAccount := func(name string) harness.User {
				return harness.User{Name: "system:serviceaccount:" + ns + ":" + name, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}}
			}
			dispatcher, webhook := serviceAccount(fullname+"-dispatcher"), serviceAccount(fullname+"-webhook")
			dc, err := dispatcher.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			wc, err := webhook.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			dispatcherLease, webhookLease := "runwarden-dispatcher-"+fullname, "runwarden-webhook-policy-reports"
			lease := func(name string) *coordinationv1.Lease {
				return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("intruder")}}
			}
			// The API server loads RBAC and new policies within seconds.
			enforced := func(ctx context.Context) (bool, error) {
				own := dc.Create(ctx, lease(dispatcherLease), client.DryRunAll)
				other := dc.Create(ctx, lease(webhookLease), client.DryRunAll)
				return own == nil && other != nil && strings.Contains(other.Error(), "creates only its own Lease"), nil
			}
			if err := harness.WaitFor(ctx, "the chart's Roles and leases policy to be in force", time.Minute, enforced); err != nil {
				t.Fatal(err)
			}
			for _, tt := range []struct {
				who  harness.User
				c    client.Client
				name string
				own  string
			}{
				{who: dispatcher, c: dc, name: webhookLease, own: dispatcherLease},
				{who: webhook, c: wc, name: dispatcherLease, own: webhookLease},
				{who: dispatcher, c: dc, name: "kube-scheduler", own: dispatcherLease},
				{who: webhook, c: wc, name: "runwarden-webhook-policy-reports-2", own: webhookLease},
			} {
				want := fmt.Sprintf("runwarden: %s creates only its own Lease (%s) in namespace %s, not %s", tt.who.Name, tt.own, ns, tt.name)
				if err := tt.c.Create(ctx, lease(tt.name)); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s creating Lease %s: %v; want %q", tt.who.Name, tt.name, err, want)
				}
			}
			// Each takes its own, and renews it; the other's it may not touch.
			for _, tt := range []struct {
				who harness.User
				c   client.Client
				own string
			}{
				{who: dispatcher, c: dc, own: dispatcherLease},
				{who: webhook, c: wc, own: webhookLease},
			} {
				l := lease(tt.own)
				l.Spec.HolderIdentity = ptr.To(tt.who.Name)
				if err := tt.c.Create(ctx, l); err != nil {
					t.Fatalf("%s creating its own Lease %s: %v", tt.who.Name, tt.own, err)
				}
				l.Spec.LeaseDurationSeconds = ptr.To[int32](15)
				if err := tt.c.Update(ctx, l); err != nil {
					t.Errorf("%s renewing its own Lease %s: %v", tt.who.Name, tt.own, err)
				}
			}
			for _, tt := range []struct {
				who    harness.User
				c      client.Client
				others string
			}{{dispatcher, dc, webhookLease}, {webhook, wc, dispatcherLease}} {
				l := &coordinationv1.Lease{}
				if err := cfg.Client().Resources().Get(ctx, tt.others, ns, l); err != nil {
					t.Fatal(err)
				}
				l.Spec.HolderIdentity = ptr.To(tt.who.Name)
				if err := tt.c.Update(ctx, l); err == nil || !strings.Contains(err.Error(), "forbidden") {
					t.Errorf("%s taking over Lease %s: %v; want it forbidden", tt.who.Name, tt.others, err)
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

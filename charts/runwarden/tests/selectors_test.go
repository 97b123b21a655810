package tests

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/internal/contract"
)

// nameLabel is the label the API server sets on every namespace to its
// name, and keeps: no one who may label a namespace can change it.
const nameLabel = "kubernetes.io/metadata.name"

// everySelector is a value set that renders every template that has a
// selector: monitoring, the Kueue examples, policy reports, the
// NetworkPolicy with metricsFrom, the PodDisruptionBudgets.
var everySelector = []string{
	"--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.dashboards.enabled=true",
	"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=runners", "--set", "queueing.kueue.examples.enabled=true",
	"--set", "policyReports.enabled=true", "--set", "runner.serviceAccount.stateBackendRole=true", "--set", "runner.stateVolume.enabled=true",
	"--set", "dispatcher.replicas=2", "--set", "metrics.service=true",
	"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`,
}

// renderDocs runs helm template (release rw in namespace runwarden) and
// returns every object it renders, decoded.
func renderDocs(t *testing.T, h string, args ...string) []map[string]any {
	t.Helper()
	out, err := run(t, h, append([]string{"template", "rw", chart, "--namespace", "runwarden"}, args...)...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	var docs []map[string]any
	for _, doc := range strings.Split(out, "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if m != nil {
			docs = append(docs, m)
		}
	}
	return docs
}

// foundSelector is one selector of a rendered object, where it is.
type foundSelector struct {
	kind, name, namespace, path string
	value                       any
}

// selectorsOf walks obj and returns every field named like a selector of
// objects (namespaceSelector, objectSelector, podSelector, labelSelector,
// selector): what decides which objects a webhook, policy, scrape, queue or
// network rule applies to. Node selectors choose nodes, whose labels are
// the platform's, and a CRD's schema only describes fields.
func selectorsOf(obj map[string]any) []foundSelector {
	kind, _ := obj["kind"].(string)
	if kind == "CustomResourceDefinition" {
		return nil
	}
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	ns, _ := meta["namespace"].(string)
	var found []foundSelector
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				p := path + "." + k
				if k == "selector" || (strings.HasSuffix(k, "Selector") && k != "nodeSelector") {
					found = append(found, foundSelector{kind: kind, name: name, namespace: ns, path: p, value: e})
				}
				walk(p, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		}
	}
	walk("", obj)
	return found
}

// labelKeys returns the label keys a selector reads (matchLabels and
// matchExpressions, the Prometheus Operator's matchNames as the name).
func labelKeys(t *testing.T, sel any) []string {
	t.Helper()
	m, ok := sel.(map[string]any)
	if !ok {
		t.Fatalf("selector %v is %T, not a map", sel, sel)
	}
	var keys []string
	for k, v := range m {
		switch k {
		case "matchLabels":
			for l := range v.(map[string]any) {
				keys = append(keys, l)
			}
		case "matchExpressions":
			for _, e := range v.([]any) {
				keys = append(keys, e.(map[string]any)["key"].(string))
			}
		case "matchNames":
			keys = append(keys, nameLabel)
		default:
			// A selector of the Service or Deployment kind: labels as keys.
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return slices.Compact(keys)
}

// TestSelectorsAreThePlatforms checks every selector the chart renders, in
// every template that has one: each either selects by what only the
// platform controls, or selects something a label's writer gains nothing
// by leaving out. A namespace is selected by its name alone (the label
// kubernetes.io/metadata.name, which the API server sets and keeps), never
// by a label whoever may patch the runner namespace could remove, switching
// off the webhooks (every check of both, the Go ones included: exec, the
// earned check, the update guard), the admission policies or the queue.
// Pods are selected by their labels only in the release namespace, the
// platform's, where nothing else runs. The one selector on an object's own
// labels that reaches the runner namespace is the mutating webhook's
// objectSelector on runwarden.dev/runner: "true", exactly what the Go
// handlers take for a runner (contract.LabelRunner), while the
// validating webhook, which has no objectSelector, refuses that label to any
// pod the Job controller did not make for the dispatcher: a pod that leaves
// the label off is no runner and is given nothing. A selector of a kind
// this test does not know fails it, to be reviewed here.
func TestSelectorsAreThePlatforms(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	for name, args := range map[string][]string{
		"defaults":       nil,
		"every selector": everySelector,
		"dev mode": {"--set", "webhook.devMode.enabled=true", "--set", "webhook.devMode.url=https://127.0.0.1:9443/mutate-pods",
			"--set", "webhook.devMode.validateURL=https://127.0.0.1:9443/validate-pods"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			webhooks := 0
			for _, obj := range renderDocs(t, h, args...) {
				for _, s := range selectorsOf(obj) {
					where := fmt.Sprintf("%s %s %s", s.kind, s.name, s.path)
					keys := labelKeys(t, s.value)
					switch {
					case strings.HasSuffix(s.path, ".namespaceSelector") && s.kind == "NetworkPolicy":
						// networkPolicy.metricsFrom: the platform's value, as written.
					case strings.HasSuffix(s.path, ".namespaceSelector"):
						if !slices.Equal(keys, []string{nameLabel}) {
							t.Errorf("%s selects namespaces by %v; want by %s alone, which no one who may label a namespace can change", where, keys, nameLabel)
						}
					case s.path == ".webhooks[].objectSelector" && s.kind == "MutatingWebhookConfiguration":
						if diff := cmp.Diff(map[string]any{"matchLabels": map[string]any{contract.LabelRunner: "true"}}, s.value); diff != "" {
							t.Errorf("%s (-want +got):\n%s\nwant exactly the label the handlers take for a runner", where, diff)
						}
					case strings.HasSuffix(s.path, "objectSelector"):
						t.Errorf("%s selects by the object's own labels %v: whoever writes the object could leave them off and go unchecked", where, keys)
					case s.namespace == "runwarden":
						// The platform's own pods in the release namespace
						// (Deployments, PodDisruptionBudgets, the metrics
						// Service, the NetworkPolicy, anti-affinity, the
						// PodMonitor's pods).
					default:
						t.Errorf("%s (namespace %q) selects by %v: not a selector this test knows; review who may write those labels", where, s.namespace, keys)
					}
				}
				kind, _ := obj["kind"].(string)
				if kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
					continue
				}
				for _, w := range obj["webhooks"].([]any) {
					webhooks++
					sel, _ := w.(map[string]any)["namespaceSelector"].(map[string]any)
					want := map[string]any{"matchExpressions": []any{
						map[string]any{"key": nameLabel, "operator": "In", "values": []any{"runwarden-runners"}},
						map[string]any{"key": nameLabel, "operator": "NotIn", "values": []any{"kube-system", "runwarden"}},
					}}
					if diff := cmp.Diff(want, sel); diff != "" {
						t.Errorf("%s's namespaceSelector (-want +got):\n%s", kind, diff)
					}
					if _, ok := w.(map[string]any)["objectSelector"]; ok && kind == "ValidatingWebhookConfiguration" {
						t.Errorf("the ValidatingWebhookConfiguration has an objectSelector: a pod's creator would choose whether it is checked")
					}
				}
			}
			if webhooks != 2 {
				t.Errorf("found %d webhooks in the webhook configurations, want 2 (the mutating and the validating)", webhooks)
			}
		})
	}
}

// TestNothingNeedsTheRunnersLabel: the label runwarden.dev/runners, which
// the webhooks once selected the runner namespace by, is neither put on the
// namespace nor read by any template (validate.yaml demanded it of a namespace
// the platform brings): whoever may label the namespace would hold a switch.
func TestNothingNeedsTheRunnersLabel(t *testing.T) {
	t.Parallel()
	read := 0
	err := filepath.WalkDir(filepath.Join(chart, "templates"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		read++
		if strings.Contains(string(b), "runwarden.dev/runners") {
			t.Errorf("%s names the label runwarden.dev/runners", path)
		}
		return nil
	})
	if err != nil || read == 0 {
		t.Fatalf("the chart's templates (%d read): %v", read, err)
	}
	out, err := run(t, helm(t, "helm3"), append([]string{"template", "rw", chart, "--namespace", "runwarden"}, everySelector...)...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	if strings.Contains(out, "runwarden.dev/runners") {
		t.Error("the rendered chart names the label runwarden.dev/runners")
	}
}

// leasesPolicy renders the chart and returns its leases policy's matched
// users and, for each, the Lease names it may create, with every Role and
// ClusterRole rule bound to each service account, and the objects.
func leasesPolicy(t *testing.T, h string, args ...string) (own map[string][]string, rules map[string][]rbacv1.PolicyRule, objs map[string]string) {
	t.Helper()
	objs = render(t, h, args...)
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	decode(t, objs, "ValidatingAdmissionPolicy/rw-runwarden-leases", &vap)
	if len(vap.Spec.MatchConstraints.ResourceRules) != 1 {
		t.Fatalf("the leases policy's rules: %+v", vap.Spec.MatchConstraints.ResourceRules)
	}
	r := vap.Spec.MatchConstraints.ResourceRules[0]
	if !slices.Equal(r.APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(r.Resources, []string{"leases"}) ||
		!slices.Contains(r.Operations, admissionregistrationv1.Create) || vap.Spec.FailurePolicy == nil || *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("the leases policy matches %+v, failurePolicy %v; want leases CREATE, Fail", r, vap.Spec.FailurePolicy)
	}
	if len(vap.Spec.Variables) != 1 || !strings.HasSuffix(vap.Spec.Variables[0].Expression, "[request.userInfo.username]") {
		t.Fatalf("the leases policy's variables: %+v", vap.Spec.Variables)
	}
	// The variable is a CEL map literal, which is JSON here.
	if err := yaml.Unmarshal([]byte(strings.TrimSuffix(vap.Spec.Variables[0].Expression, "[request.userInfo.username]")), &own); err != nil {
		t.Fatalf("the leases policy's names: %v", err)
	}
	var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
	decode(t, objs, "ValidatingAdmissionPolicyBinding/rw-runwarden-leases", &b)
	want := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: nameLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"runwarden"}}}}
	if b.Spec.PolicyName != vap.Name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) ||
		b.Spec.MatchResources == nil || !cmp.Equal(want, b.Spec.MatchResources.NamespaceSelector) {
		t.Errorf("the leases binding: %+v; want the policy, Deny, the release namespace by name", b.Spec)
	}
	rules = map[string][]rbacv1.PolicyRule{}
	for key, doc := range objs {
		kind, _, _ := strings.Cut(key, "/")
		if kind != "RoleBinding" && kind != "ClusterRoleBinding" {
			continue
		}
		var rb rbacv1.RoleBinding
		if err := yaml.Unmarshal([]byte(doc), &rb); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		var role rbacv1.Role
		decode(t, objs, rb.RoleRef.Kind+"/"+rb.RoleRef.Name, &role)
		for _, s := range rb.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind && (kind == "ClusterRoleBinding" || role.Namespace == "runwarden") {
				u := "system:serviceaccount:" + s.Namespace + ":" + s.Name
				rules[u] = append(rules[u], role.Rules...)
			}
		}
	}
	return own, rules, objs
}

// TestLeasesAreTheirOwn: the dispatcher and the webhook may each create, in
// the release namespace, only their own Leases, named in the chart (the
// leases policy), where their Roles' create on leases, which no name can
// limit, would let each make the other's first and keep it from leading.
// Every other right of theirs on Leases there is by those names alone, so
// creating is the one way in the policy must close; the names are those the
// binaries use: the dispatcher's runwarden-dispatcher-<--dispatcher-id>, the
// webhook's reportLease (webhook/reports.go).
func TestLeasesAreTheirOwn(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	src, err := os.ReadFile("../../../webhook/reports.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`const reportLease = "([^"]+)"`).FindSubmatch(src)
	if m == nil {
		t.Fatal("webhook/reports.go has no const reportLease")
	}
	reportLease := string(m[1])
	const (
		dispatcherSA = "system:serviceaccount:runwarden:rw-runwarden-dispatcher"
		webhookSA    = "system:serviceaccount:runwarden:rw-runwarden-webhook"
	)
	for _, tt := range []struct {
		name string
		args []string
		want map[string][]string
	}{
		{name: "defaults", want: map[string][]string{dispatcherSA: {"runwarden-dispatcher-rw-runwarden"}, webhookSA: {}}},
		{name: "policy reports", args: []string{"--set", "policyReports.enabled=true"},
			want: map[string][]string{dispatcherSA: {"runwarden-dispatcher-rw-runwarden"}, webhookSA: {reportLease}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			own, rules, objs := leasesPolicy(t, h, tt.args...)
			if diff := cmp.Diff(tt.want, own); diff != "" {
				t.Errorf("the Leases each service account may create (-want +got):\n%s", diff)
			}
			var d appsv1.Deployment
			decode(t, objs, "Deployment/rw-runwarden-dispatcher", &d)
			if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--dispatcher-id=rw-runwarden") ||
				!slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--leader-elect-namespace=runwarden") {
				t.Errorf("the dispatcher's args %v: want --dispatcher-id=rw-runwarden (its Lease runwarden-dispatcher-rw-runwarden) in namespace runwarden",
					d.Spec.Template.Spec.Containers[0].Args)
			}
			for sa, rs := range rules {
				for _, r := range rs {
					if !slices.Contains(r.Resources, "leases") && !slices.Contains(r.Resources, "*") {
						continue
					}
					for _, v := range r.Verbs {
						switch {
						case v == "create":
							if _, ok := own[sa]; !ok {
								t.Errorf("%s may create any Lease in the release namespace, and the leases policy does not hold it to its own", sa)
							}
						case len(r.ResourceNames) == 0:
							t.Errorf("%s may %s any Lease in the release namespace: only create may go without a name", sa, v)
						default:
							for _, n := range r.ResourceNames {
								if !slices.Contains(own[sa], n) {
									t.Errorf("%s may %s Lease %s, not one of its own (%v)", sa, v, n, own[sa])
								}
							}
						}
					}
				}
			}
		})
	}
}

package tests

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	dispatchermetrics "github.com/runwarden/runwarden/dispatcher/metrics"
	webhookmetrics "github.com/runwarden/runwarden/webhook/metrics"
)

const (
	rulesFile     = "../monitoring/rules.yaml"
	dashboardFile = "../monitoring/dashboard.json"
)

// monitoringOn turns every monitoring object on.
var monitoringOn = []string{"--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
	"--set", "monitoring.dashboards.enabled=true", "--set", "monitoring.labels.release=kube-prometheus-stack"}

// TestMonitoringObjects renders the monitoring objects: none by default or
// in dev mode (no pods to monitor), each part on its own switch, and the
// extra labels on the PodMonitor and PrometheusRule, never over the chart's.
func TestMonitoringObjects(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	devMode := []string{"--set", "webhook.devMode.enabled=true", "--set", "webhook.devMode.url=https://127.0.0.1:9443/mutate-pods"}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{name: "defaults"},
		{name: "all on", args: monitoringOn, want: []string{"ConfigMap/rw-runwarden-dashboard", "PodMonitor/rw-runwarden", "PrometheusRule/rw-runwarden"}},
		{name: "rules alone", args: []string{"--set", "monitoring.prometheusRule.enabled=true"}, want: []string{"PrometheusRule/rw-runwarden"}},
		{name: "dev mode", args: append(slices.Clone(monitoringOn), devMode...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, h, append(tt.args, "--set", "monitoring.labels.release=kube-prometheus-stack",
				"--set", "monitoring.labels.app\\.kubernetes\\.io/name=other")...)
			var got []string
			for key := range objs {
				if strings.HasPrefix(key, "PodMonitor/") || strings.HasPrefix(key, "PrometheusRule/") || strings.HasSuffix(key, "-dashboard") {
					got = append(got, key)
				}
			}
			slices.Sort(got)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("monitoring objects (-want +got):\n%s", diff)
			}
			for _, key := range got {
				var m metav1.PartialObjectMetadata
				decode(t, objs, key, &m)
				if m.Labels["app.kubernetes.io/name"] != "runwarden" {
					t.Errorf("%s: app.kubernetes.io/name %q; monitoring.labels must not replace the chart's labels", key, m.Labels["app.kubernetes.io/name"])
				}
				isDashboard := strings.HasPrefix(key, "ConfigMap/")
				if got, want := m.Labels["release"], map[bool]string{false: "kube-prometheus-stack", true: ""}[isDashboard]; got != want {
					t.Errorf("%s: label release %q, want %q", key, got, want)
				}
			}
		})
	}
}

// TestPrometheusRuleEmbedsRules checks that the PrometheusRule holds the
// groups of the rules file that promtool checks and tests, unchanged.
func TestPrometheusRuleEmbedsRules(t *testing.T) {
	t.Parallel()
	objs := render(t, helm(t, "helm3"), monitoringOn...)
	var rule struct {
		APIVersion string
		Spec       struct{ Groups []any }
	}
	decode(t, objs, "PrometheusRule/rw-runwarden", &rule)
	if rule.APIVersion != "monitoring.coreos.com/v1" {
		t.Errorf("apiVersion %q", rule.APIVersion)
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct{ Groups []any }
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if len(file.Groups) == 0 {
		t.Fatalf("%s has no groups", rulesFile)
	}
	if diff := cmp.Diff(file.Groups, rule.Spec.Groups); diff != "" {
		t.Errorf("PrometheusRule spec.groups differ from %s (-file +rendered):\n%s", rulesFile, diff)
	}
}

// TestPodMonitorScrapesMetricsPorts checks that the PodMonitor selects the
// dispatcher's and the webhook's pods, and no other, on a port that each
// names and that their metrics server listens on.
func TestPodMonitorScrapesMetricsPorts(t *testing.T) {
	t.Parallel()
	objs := render(t, helm(t, "helm3"), monitoringOn...)
	var pm struct {
		Spec struct {
			Selector            metav1.LabelSelector
			NamespaceSelector   struct{ MatchNames []string }
			PodMetricsEndpoints []struct{ Port, Path, Scheme string }
		}
	}
	decode(t, objs, "PodMonitor/rw-runwarden", &pm)
	selector, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"runwarden"}, pm.Spec.NamespaceSelector.MatchNames); diff != "" {
		t.Errorf("namespaces (-want +got):\n%s", diff)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("endpoints %+v, want one", pm.Spec.PodMetricsEndpoints)
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	if ep.Path != "/metrics" || ep.Scheme != "http" {
		t.Errorf("endpoint %+v, want http and /metrics", ep)
	}
	for key, doc := range objs {
		if !strings.HasPrefix(key, "Deployment/") {
			continue
		}
		var d appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatal(err)
		}
		component := d.Spec.Template.Labels["app.kubernetes.io/component"]
		selected := selector.Matches(labels.Set(d.Spec.Template.Labels))
		if want := component == "dispatcher" || component == "webhook"; selected != want {
			t.Errorf("%s: selected %v, want %v", key, selected, want)
		}
		if !selected {
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == ep.Port })
		if i < 0 {
			t.Errorf("%s: no container port named %q", key, ep.Port)
			continue
		}
		if want := "--metrics-bind-address=:" + strconv.Itoa(int(c.Ports[i].ContainerPort)); !slices.Contains(c.Args, want) {
			t.Errorf("%s: port %s is %d, but the args lack %s: %v", key, ep.Port, c.Ports[i].ContainerPort, want, c.Args)
		}
	}
	// The helm test pod, which runs as the dispatcher, is not scraped.
	var hook corev1.Pod
	for key, doc := range objs {
		if strings.HasPrefix(key, "Pod/") {
			if err := yaml.Unmarshal([]byte(doc), &hook); err != nil {
				t.Fatal(err)
			}
			if selector.Matches(labels.Set(hook.Labels)) {
				t.Errorf("the PodMonitor selects %s", key)
			}
		}
	}
}

// TestDashboardConfigMap checks that the dashboard ConfigMap holds the
// dashboard file as it is, labelled for Grafana's sidecar, in the namespace
// asked for.
func TestDashboardConfigMap(t *testing.T) {
	t.Parallel()
	objs := render(t, helm(t, "helm3"), append(slices.Clone(monitoringOn), "--set", "monitoring.dashboards.namespace=grafana",
		"--set", "monitoring.dashboards.annotations.grafana_folder=runwarden", "--set", "monitoring.dashboards.labels.team=platform")...)
	var cm corev1.ConfigMap
	decode(t, objs, "ConfigMap/rw-runwarden-dashboard", &cm)
	want, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(strings.TrimSpace(string(want)), strings.TrimSpace(cm.Data["runwarden.json"])); diff != "" {
		t.Errorf("runwarden.json differs from %s (-file +rendered):\n%s", dashboardFile, diff)
	}
	if cm.Namespace != "grafana" || cm.Labels["grafana_dashboard"] != "1" || cm.Labels["team"] != "platform" || cm.Annotations["grafana_folder"] != "runwarden" {
		t.Errorf("namespace %q, labels %v, annotations %v", cm.Namespace, cm.Labels, cm.Annotations)
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	SchemaVersion int
	Templating    struct{ List []variable }
	Panels        []panel
}

type variable struct {
	Name, Type string
	Query      any // a string, or an object holding the query
	Definition string
}

type panel struct {
	ID         int
	Type       string
	Title      string
	Datasource *struct{ Type, UID string }
	Targets    []struct {
		Expr       string
		Datasource *struct{ Type, UID string }
	}
	Panels []panel // a collapsed row's
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// rules is the part of a Prometheus rules file the tests read.
type rules struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert, Record, Expr string
			For                 string
			Labels              map[string]string
			Annotations         map[string]string
		}
	}
}

func readRules(t *testing.T) rules {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var r rules
	if err := yaml.UnmarshalStrict(b, &r); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return r
}

// TestDashboardShape checks what Grafana needs to load the dashboard from
// the ConfigMap into any Grafana: every query goes to the data source the
// ${datasource} variable picks, and panel IDs are unique.
func TestDashboardShape(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d; 36 or later", d.SchemaVersion)
	}
	i := slices.IndexFunc(d.Templating.List, func(v variable) bool { return v.Name == "datasource" })
	if i < 0 || d.Templating.List[i].Type != "datasource" || d.Templating.List[i].Query != "prometheus" {
		t.Errorf("no Prometheus data source variable named datasource: %+v", d.Templating.List)
	}
	ids := map[int]string{}
	for _, p := range allPanels(d.Panels) {
		if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share the ID %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		for _, q := range p.Targets {
			if q.Datasource == nil || q.Datasource.UID != "${datasource}" || q.Expr == "" {
				t.Errorf("panel %q: query %+v, want an expression on ${datasource}", p.Title, q)
			}
		}
	}
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// metricName finds metric names in PromQL; a histogram's series add
// _bucket, _sum and _count to the name the code registers.
var (
	metricName   = regexp.MustCompile(`runwarden_[a-z_]+`)
	seriesSuffix = regexp.MustCompile(`_(bucket|sum|count)$`)
)

// registered gathers the metrics the dispatcher and the webhook register,
// each vector with one series so that it shows: name -> type.
func registered(t *testing.T) map[string]string {
	t.Helper()
	dreg := prometheus.NewRegistry()
	d := dispatchermetrics.New(dreg, 1)
	d.Finished("Failed", "NonZeroExit")
	d.SourceError("poll")
	d.Ran("Succeeded", time.Minute)
	d.TemplateReload("failure")
	wreg := prometheus.NewRegistry()
	w := webhookmetrics.New(wreg)
	if err := w.WatchCertificate(filepath.Join(t.TempDir(), "tls.crt")); err != nil {
		t.Fatal(err)
	}
	w.Admission("mutated", time.Millisecond)
	w.Violation("no-privileged", "dryrun")
	w.Reload("", errors.New("refused"))
	w.Loaded("sha256:0")
	w.DecisionCache(nil)
	out := map[string]string{}
	for _, g := range []prometheus.Gatherer{dreg, wreg} {
		families, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			out[f.GetName()] = f.GetType().String()
		}
	}
	return out
}

// used returns the registered metric each name in exprs refers to, and the
// names that refer to none.
func used(exprs []string, known map[string]string) (names map[string]bool, unknown []string) {
	names = map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			if _, ok := known[n]; !ok {
				if base := seriesSuffix.ReplaceAllString(n, ""); known[base] == "HISTOGRAM" {
					n = base
				}
			}
			if _, ok := known[n]; !ok {
				unknown = append(unknown, n)
				continue
			}
			names[n] = true
		}
	}
	return names, unknown
}

// TestMonitoringUsesRegisteredMetrics checks every metric name the
// dashboard's and the alerts' expressions use against the metrics the
// dispatcher and the webhook register, so a renamed metric cannot leave a
// panel empty or an alert silent; and that the dashboard shows every metric.
func TestMonitoringUsesRegisteredMetrics(t *testing.T) {
	t.Parallel()
	known := registered(t)
	if len(known) != 21 {
		t.Errorf("%d metrics registered, want the 12 of the dispatcher and the 9 of the webhook: %v", len(known), known)
	}

	d := readDashboard(t)
	var exprs []string
	for _, p := range allPanels(d.Panels) {
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		exprs = append(exprs, v.Definition)
		if q, ok := v.Query.(map[string]any); ok {
			s, _ := q["query"].(string)
			exprs = append(exprs, s)
		} else if s, ok := v.Query.(string); ok {
			exprs = append(exprs, s)
		}
	}
	names, unknown := used(exprs, known)
	if len(unknown) > 0 {
		t.Errorf("%s uses metrics that are not registered: %v", dashboardFile, unknown)
	}
	var missing []string
	for n := range known {
		if !names[n] {
			missing = append(missing, n)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("%s shows no panel of %v", dashboardFile, missing)
	}

	r := readRules(t)
	exprs = nil
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			exprs = append(exprs, rule.Expr)
		}
	}
	names, unknown = used(exprs, known)
	if len(unknown) > 0 {
		t.Errorf("%s uses metrics that are not registered: %v", rulesFile, unknown)
	}
	if len(names) == 0 {
		t.Errorf("%s uses no runwarden metric", rulesFile)
	}
}

// TestAlertsAreComplete checks what every alert carries: a severity the
// routing knows, a summary and a description, a for: that rides out a
// scrape or two, unit tests in rules_test.yaml, and its entry in
// docs/operations.md.
func TestAlertsAreComplete(t *testing.T) {
	t.Parallel()
	r := readRules(t)
	unitTests, err := os.ReadFile("../monitoring/rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile("../../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range r.Groups {
		for _, rule := range g.Rules {
			if rule.Alert == "" {
				continue
			}
			alerts++
			if s := rule.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", rule.Alert, s)
			}
			if rule.Annotations["summary"] == "" || rule.Annotations["description"] == "" {
				t.Errorf("%s: annotations %v, want a summary and a description", rule.Alert, rule.Annotations)
			}
			if d, err := time.ParseDuration(rule.For); err != nil || d < time.Minute {
				t.Errorf("%s: for %q, want a minute or more", rule.Alert, rule.For)
			}
			// One test that fires it, one at least that does not.
			if n := strings.Count(string(unitTests), "alertname: "+rule.Alert+"\n"); n < 2 {
				t.Errorf("%s: %d evaluations in rules_test.yaml, want 2 at least", rule.Alert, n)
			}
			if !strings.Contains(string(docs), "`"+rule.Alert+"`") {
				t.Errorf("%s: not described in docs/operations.md", rule.Alert)
			}
		}
	}
	if alerts == 0 {
		t.Errorf("%s holds no alert", rulesFile)
	}
}

// Package tests checks the runwarden chart with the real helm binaries:
// lint, golden renders of representative values, and the schema's refusals.
package tests

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/golden-*.yaml")

const chart = ".."

func helm(t *testing.T, tool string) string {
	t.Helper()
	out, err := exec.Command("../../../hack/tools.sh", "path", tool).Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "helm")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skipf("skipped: %s is not built; run 'hack/tools.sh %s' (make unit does)", tool, tool)
	return ""
}

func run(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// No cluster: a kubeconfig that does not exist.
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir(),
		"KUBECONFIG="+filepath.Join(t.TempDir(), "none"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String() + stderr.String(), err
}

func TestLint(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"helm3", "helm4"} {
		out, err := run(t, helm(t, tool), "lint", chart, "--strict")
		if err != nil {
			t.Errorf("%s lint: %v\n%s", tool, err, out)
		}
	}
}

// TestGolden renders representative value sets and compares them with
// testdata/golden-<name>.yaml (go test -update rewrites them).
func TestGolden(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	sets := map[string][]string{
		"default": nil,
		"demo":    {"-f", "../../../hack/demo/values.yaml", "--set", "images.registry=localhost:5000/runwarden", "--set", "images.tag=v1", "--set", "images.runnerTag=v1"},
		"dev-mode": {"--set", "webhook.devMode.enabled=true", "--set", "webhook.devMode.url=https://127.0.0.1:9443/mutate-pods",
			// The base64 of a PEM bundle, as the schema asks.
			"--set", "webhook.devMode.caBundle=LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="},
		"cert-manager": {"--set", "webhook.certificates.mode=certManager", "--set", "webhook.certificates.certManagerIssuer.name=ca",
			"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`},
		"state-volume": {"--set", "runner.stateVolume.enabled=true", "--set", "runner.stateVolume.storageClassName=retained", "--set", "webhook.auditMode=true"},
		"orchestrator-jwt": {"--set", "dispatcher.taskSource=orchestrator", "--set", "dispatcher.orchestrator.url=https://orchestrator.example.com",
			"--set", "dispatcher.orchestrator.existingSecret=runner-key", "--set", "dispatcher.orchestrator.proxy=http://proxy.internal:3128",
			"--set", "dispatcher.orchestrator.caConfigMap=corporate-ca"},
		"platform": {"--set", "webhook.platform.secretStores.aws.enabled=true", "--set", "webhook.platform.secretStores.aws.secretName=aws-creds",
			"--set", "webhook.platform.secretStores.vault.enabled=true", "--set", "webhook.platform.secretStores.vault.address=https://vault:8200",
			"--set", "webhook.platform.secretStores.vault.auth=kubernetes", "--set", "webhook.platform.secretStores.vault.role=runner",
			"--set", "webhook.platform.workloadIdentity.aws.enabled=true", "--set", "webhook.platform.shape.allowedRegistries={registry.example.com}",
			// Images by digest, one left by tag.
			"--set", "images.digests.webhook=sha256:" + strings.Repeat("ab", 32), "--set", "images.digests.runner=sha256:" + strings.Repeat("cd", 32)},
		"runner-proxy-ca": {"--set", "runner.stateVolume.enabled=true", "--set", "runner.proxy.httpsProxy=http://proxy.internal:3128",
			"--set", "runner.proxy.noProxy=.svc\\,10.0.0.0/8", "--set", "runner.caBundle.configMap=corporate-ca",
			// The platform's own volumes stay beside the chart's.
			"--set", "runner.podTemplate.spec.volumes[0].name=scratch", "--set", "runner.podTemplate.spec.volumes[0].emptyDir.medium=Memory"},
		// The Gitea source, with its registration token and a CA.
		"gitea": {"--set", "dispatcher.taskSource=gitea", "--set", "dispatcher.gitea.url=https://gitea.example.com/",
			"--set", "dispatcher.gitea.labels={tofu,linux}", "--set", "dispatcher.gitea.registrationSecret=gitea-registration",
			"--set", "dispatcher.gitea.caConfigMap=corporate-ca", "--set", "dispatcher.gitea.templates.large=runner-large"},
		"orchestrator-exchange": {"--set", "dispatcher.taskSource=orchestrator", "--set", "dispatcher.orchestrator.url=https://orchestrator.example.com",
			"--set", "dispatcher.orchestrator.auth=exchange", "--set", "dispatcher.orchestrator.exchangeAudience=orchestrator"},
		// Queueing through Kueue, with the example queue and priority classes.
		"kueue": {"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=runners", "--set", "queueing.kueue.maxQueued=50",
			"--set", "queueing.defaultPriorityClass=routine", "--set", "queueing.kueue.examples.enabled=true", "--set", "queueing.kueue.examples.cohort=platform",
			"--set", "queueing.kueue.examples.priorityClasses.urgent=1000", "--set", "queueing.kueue.examples.priorityClasses.routine=100"},
		// The PodMonitor, the PrometheusRule and the dashboard.
		"monitoring": {"--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.podMonitor.interval=30s",
			"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.dashboards.enabled=true",
			"--set", "monitoring.labels.release=kube-prometheus-stack", "--set", "monitoring.dashboards.annotations.grafana_folder=runwarden"},
	}
	for name, args := range sets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out, err := run(t, h, append([]string{"template", "rw", chart, "--namespace", "runwarden"}, args...)...)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			golden := filepath.Join("testdata", "golden-"+name+".yaml")
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if diff := cmp.Diff(string(want), out); diff != "" {
				t.Errorf("render differs from %s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

func TestRefusesBadValues(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "unknown key", args: []string{"--set", "dispatchr.replicas=1"}, want: "additional properties 'dispatchr' not allowed"},
		{name: "concurrency", args: []string{"--set", "dispatcher.maxConcurrent=0"}, want: "/dispatcher/maxConcurrent"},
		{name: "negative dispatcher replicas", args: []string{"--set", "dispatcher.replicas=-1"}, want: "at '/dispatcher/replicas': minimum: got -1, want 0"},
		{name: "lease duration not a duration", args: []string{"--set", "dispatcher.leaderElection.leaseDuration=fifteen"}, want: "/dispatcher/leaderElection/leaseDuration"},
		{name: "zero retry period", args: []string{"--set", "dispatcher.leaderElection.retryPeriod=0s"}, want: "/dispatcher/leaderElection/retryPeriod"},
		{name: "unknown leader election key", args: []string{"--set", "dispatcher.leaderElection.leaseDurationSeconds=15"}, want: "'leaseDurationSeconds' not allowed"},
		// The dispatcher exits at start unless each is shorter than the one before.
		{name: "renew deadline as long as the lease", args: []string{"--set", "dispatcher.leaderElection.renewDeadline=15s"}, want: "dispatcher.leaderElection.renewDeadline (15s) must be shorter than leaseDuration (15s)"},
		{name: "renew deadline longer than the lease, in other units", args: []string{"--set", "dispatcher.leaderElection.leaseDuration=1m", "--set", "dispatcher.leaderElection.renewDeadline=1m0.5s"}, want: "renewDeadline (1m0.5s) must be shorter than leaseDuration (1m)"},
		{name: "retry period as long as the renew deadline", args: []string{"--set", "dispatcher.leaderElection.retryPeriod=10000ms"}, want: "dispatcher.leaderElection.retryPeriod (10000ms) must be shorter than renewDeadline (10s)"},
		{name: "deadline", args: []string{"--set", "dispatcher.defaultDeadline=soon"}, want: "/dispatcher/defaultDeadline"},
		{name: "pull policy", args: []string{"--set", "images.pullPolicy=Sometimes"}, want: "/images/pullPolicy"},
		{name: "certificate mode", args: []string{"--set", "webhook.certificates.mode=vault"}, want: "/webhook/certificates/mode"},
		{name: "unknown task source", args: []string{"--set", "dispatcher.taskSource=queue"}, want: "/dispatcher/taskSource"},
		{name: "orchestrator without url", args: []string{"--set", "dispatcher.taskSource=orchestrator"}, want: "needs dispatcher.orchestrator.url"},
		{name: "orchestrator over http", args: []string{"--set", "dispatcher.orchestrator.url=http://orch.example"}, want: "/dispatcher/orchestrator/url"},
		{name: "orchestrator jwt without secret", args: []string{"--set", "dispatcher.taskSource=orchestrator", "--set", "dispatcher.orchestrator.url=https://o.example"}, want: "needs dispatcher.orchestrator.existingSecret: the Secret holding the Ed25519 private key"},
		// A cloud store may go without a Secret (workload identity gives the
		// resolver its credentials), not with a misspelt key.
		{name: "secret store with a misspelt key", args: []string{"--set", "webhook.platform.secretStores.aws.enabled=true", "--set", "webhook.platform.secretStores.aws.secretname=aws-creds"}, want: "/webhook/platform/secretStores/aws"},
		{name: "vault kubernetes auth without role", args: []string{"--set", "webhook.platform.secretStores.vault.enabled=true", "--set", "webhook.platform.secretStores.vault.address=https://vault:8200", "--set", "webhook.platform.secretStores.vault.auth=kubernetes"}, want: "role"},
		{name: "vault token auth without secret", args: []string{"--set", "webhook.platform.secretStores.vault.enabled=true", "--set", "webhook.platform.secretStores.vault.address=https://vault:8200"}, want: "secretName"},
		{name: "unknown platform part", args: []string{"--set", "webhook.platform.secretStore.aws.enabled=true"}, want: "'secretStore' not allowed"},
		{name: "azure identity mode", args: []string{"--set", "webhook.platform.workloadIdentity.azure.mode=magic"}, want: "/webhook/platform/workloadIdentity/azure/mode"},
		{name: "secret reference store", args: []string{"--set", "webhook.platform.secretRefs.allowedStores={ssm,keepass}"}, want: "/webhook/platform/secretRefs/allowedStores"},
		{name: "secret pattern without a store", args: []string{"--set", "webhook.platform.secretRefs.allowedPatterns={team-a/*}"}, want: "/webhook/platform/secretRefs/allowedPatterns/0"},
		{name: "vault's own paths as a mount", args: []string{"--set", "webhook.platform.secretStores.vault.kvMounts={secret,auth/token}"}, want: "/webhook/platform/secretStores/vault/kvMounts/1"},
		{name: "vault's sys as an engine mount", args: []string{"--set", "webhook.platform.secretStores.vault.engineMounts={/sys}"}, want: "/webhook/platform/secretStores/vault/engineMounts/0"},
		{name: "gitea without url", args: []string{"--set", "dispatcher.taskSource=gitea"}, want: "needs dispatcher.gitea.url"},
		{name: "gitea label with a scheme", args: []string{"--set", "dispatcher.gitea.labels={ubuntu:docker://node}"}, want: "/dispatcher/gitea/labels/0"},
		{name: "gitea with kueue", args: []string{"--set", "dispatcher.taskSource=gitea", "--set", "dispatcher.gitea.url=https://g.example/", "--set", "queueing.kueue.enabled=true"}, want: "does not run with queueing.kueue.enabled yet"},
		{name: "orchestrator auth", args: []string{"--set", "dispatcher.orchestrator.auth=password"}, want: "/dispatcher/orchestrator/auth"},
		{name: "role mapping ConfigMap in the runner namespace", args: []string{"--set", "runnerNamespace=runners", "--set", "webhook.platform.workloadIdentity.aws.enabled=true",
			"--set", "webhook.platform.workloadIdentity.aws.roleMappingConfigMap.namespace=runners", "--set", "webhook.platform.workloadIdentity.aws.roleMappingConfigMap.name=roles"},
			want: "roleMappingConfigMap is in the runner namespace runners"},
		{name: "runner namespace is the release's", args: []string{"--set", "runnerNamespace=runwarden"}, want: "runnerNamespace must differ from the release namespace"},
		{name: "dev mode without url", args: []string{"--set", "webhook.devMode.enabled=true"}, want: "webhook.devMode.url"},
		{name: "policy override name", args: []string{"--set", "webhook.policyOverrides.evil=x"}, want: "'evil' does not match pattern"},
		{name: "cert-manager without issuer", args: []string{"--set", "webhook.certificates.mode=certManager"}, want: "needs webhook.certificates.certManagerIssuer.name"},
		{name: "zero job ttl", args: []string{"--set", "dispatcher.jobTTL=0s"}, want: "/dispatcher/jobTTL"},
		// Jobs count the deadline and TTL in whole seconds: 500ms would be 0,
		// which the dispatcher replaces by its default.
		{name: "deadline under a second", args: []string{"--set", "dispatcher.defaultDeadline=500ms"}, want: "/dispatcher/defaultDeadline"},
		{name: "job ttl under a second", args: []string{"--set", "dispatcher.jobTTL=999ms"}, want: "/dispatcher/jobTTL"},
		{name: "unschedulable timeout under a second", args: []string{"--set", "dispatcher.unschedulableTimeout=0.5s"}, want: "/dispatcher/unschedulableTimeout"},
		{name: "poll wait under a second", args: []string{"--set", "dispatcher.orchestrator.pollWait=500ms"}, want: "/dispatcher/orchestrator/pollWait"},
		{name: "credential set name unfit for a volume", args: []string{"--set-json", `webhook.platform.credentialSets=[{"name":"github_app","secretName":"gh"}]`}, want: "/webhook/platform/credentialSets/0/name"},
		{name: "digest that is a tag", args: []string{"--set", "images.digests.webhook=latest"}, want: "/images/digests/webhook"},
		// The chart's own variables carry the downward API the webhook's
		// Events and the dispatcher's identity need.
		{name: "extra env naming the chart's own", args: []string{"--set-json", `webhook.extraEnv=[{"name":"POD_UID","value":"x"}]`}, want: "/webhook/extraEnv/0/name"},
		{name: "extra env without a name", args: []string{"--set-json", `dispatcher.extraEnv=[{"value":"x"}]`}, want: "/dispatcher/extraEnv/0"},
		{name: "extra env with a number", args: []string{"--set-json", `webhook.extraEnv=[{"name":"GOGC","value":1000}]`}, want: "/webhook/extraEnv/0/value"},
		{name: "extra env with a misspelt key", args: []string{"--set-json", `webhook.extraEnv=[{"name":"GOGC","valu":"1000"}]`}, want: "/webhook/extraEnv/0"},
		{name: "extra env naming the dispatcher's own", args: []string{"--set-json", `dispatcher.extraEnv=[{"name":"POD_NAME","value":"x"}]`}, want: "/dispatcher/extraEnv/0/name"},
		// The API server refuses both, and neither.
		{name: "extra env with a value and valueFrom", args: []string{"--set-json", `webhook.extraEnv=[{"name":"A","value":"x","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]`}, want: "/webhook/extraEnv/0"},
		{name: "extra env with an empty valueFrom", args: []string{"--set-json", `webhook.extraEnv=[{"name":"A","valueFrom":{}}]`}, want: "/webhook/extraEnv/0/valueFrom"},
		{name: "dev mode CA bundle in PEM", args: []string{"--set", "webhook.devMode.enabled=true", "--set", "webhook.devMode.url=https://127.0.0.1:9443/mutate-pods",
			"--set-json", `webhook.devMode.caBundle="-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"`}, want: "/webhook/devMode/caBundle"},
		{name: "state volume one pod at a time", args: []string{"--set", "runner.stateVolume.enabled=true", "--set", "runner.stateVolume.accessMode=ReadWriteOncePod"}, want: "runner.stateVolume.accessMode ReadWriteOncePod"},
		{name: "comma in a repository pattern", args: []string{"--set-json", `dispatcher.repoAllowList=["^https://git\\.example\\.com/[a-z]{2,10}/infra\\.git$"]`}, want: "/dispatcher/repoAllowList/0"},
		// The dispatcher refuses --priority-class with --kueue: Kueue holds
		// the values of its WorkloadPriorityClasses.
		{name: "priority classes with kueue", args: []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.priorityClasses.urgent=1000", "--set", "queueing.priorityClasses.batch=-10"},
			want: "queueing.priorityClasses (batch, urgent) cannot go with queueing.kueue.enabled"},
		{name: "default priority class not among the classes", args: []string{"--set", "queueing.priorityClasses.urgent=1000", "--set", "queueing.defaultPriorityClass=routine"},
			want: "queueing.defaultPriorityClass routine is not one of queueing.priorityClasses (urgent)"},
		{name: "kueue examples without a default queue", args: []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.examples.enabled=true"},
			want: "queueing.kueue.examples.enabled needs queueing.kueue.defaultQueue"},
		{name: "kueue examples without kueue", args: []string{"--set", "queueing.kueue.defaultQueue=runners", "--set", "queueing.kueue.examples.enabled=true"},
			want: "queueing.kueue.examples.enabled needs queueing.kueue.enabled"},
		{name: "negative max queued", args: []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.maxQueued=-1"}, want: "at '/queueing/kueue/maxQueued': minimum: got -1, want 1"},
		{name: "zero max queued", args: []string{"--set", "queueing.kueue.maxQueued=0"}, want: "/queueing/kueue/maxQueued"},
		{name: "priority beyond 32 bits", args: []string{"--set", "queueing.priorityClasses.urgent=2147483648"}, want: "/queueing/priorityClasses/urgent"},
		{name: "priority that is not a whole number", args: []string{"--set", "queueing.priorityClasses.urgent=high"}, want: "/queueing/priorityClasses/urgent"},
		{name: "priority class name unfit for an object", args: []string{"--set", "queueing.priorityClasses.Urgent=1"}, want: "'Urgent' does not match pattern"},
		{name: "default queue unfit for an object", args: []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=Team_A"}, want: "/queueing/kueue/defaultQueue"},
		{name: "scrape interval not a duration", args: []string{"--set", "monitoring.podMonitor.interval=often"}, want: "/monitoring/podMonitor/interval"},
		{name: "service monitor", args: []string{"--set", "monitoring.serviceMonitor.enabled=true"}, want: "'serviceMonitor' not allowed"},
		{name: "dashboard namespace unfit", args: []string{"--set", "monitoring.dashboards.namespace=Grafana"}, want: "/monitoring/dashboards/namespace"},
		// A task's Secret is rw-secret-<its Job's name>: a platform Secret of
		// such a name could be read by a Job named to match.
		{name: "store credentials named like a task's Secret", args: []string{"--set", "webhook.platform.secretStores.vault.enabled=true", "--set", "webhook.platform.secretStores.vault.address=https://vault:8200",
			"--set", "webhook.platform.secretStores.vault.secretName=rw-secret-rw-vault"}, want: "Secret rw-secret-rw-vault of the platform (the runner pod template, webhook.platform.secretStores or credentialSets) begins with rw-secret-"},
		{name: "credential set named like a task's Secret", args: []string{"--set-json", `webhook.platform.credentialSets=[{"name":"github","secretName":"rw-secret-github"}]`}, want: "Secret rw-secret-github of the platform"},
		{name: "pull secret named like a task's Secret", args: []string{"--set", "images.pullSecrets[0].name=rw-secret-regcred"}, want: "Secret rw-secret-regcred of the platform"},
		{name: "kueue's users not a list", args: []string{"--set", "queueing.kueue.controllerUsers=kueue"}, want: "/queueing/kueue/controllerUsers"},
		// The action per rule: deny, warn or dryrun, nothing else, and only
		// one way to set the default.
		{name: "unknown default action", args: []string{"--set", "webhook.platform.enforcement.default=audit"},
			want: "at '/webhook/platform/enforcement/default': value must be one of 'deny', 'warn', 'dryrun'"},
		{name: "unknown rule action", args: []string{"--set", "webhook.platform.enforcement.rules.no-privileged=off"},
			want: "at '/webhook/platform/enforcement/rules/no-privileged': value must be one of 'deny', 'warn', 'dryrun'"},
		{name: "unknown namespace action", args: []string{"--set", "webhook.platform.enforcement.namespaces.team-a.no-privileged=DryRun"},
			want: "at '/webhook/platform/enforcement/namespaces/team-a/no-privileged': value must be one of 'deny', 'warn', 'dryrun'"},
		{name: "a secret-reference rule relaxed", args: []string{"--set", "webhook.platform.enforcement.rules.secret-ref-name=dryrun"},
			want: "at '/webhook/platform/enforcement/rules/secret-ref-name': value must be 'deny'"},
		{name: "a secret-reference rule relaxed in a namespace", args: []string{"--set", "webhook.platform.enforcement.namespaces.team-a.secret-ref-pattern=warn"},
			want: "at '/webhook/platform/enforcement/namespaces/team-a/secret-ref-pattern': value must be 'deny'"},
		{name: "a boundary rule relaxed", args: []string{"--set", "webhook.platform.enforcement.namespaces.team-a.no-ephemeral-containers=dryrun"},
			want: "at '/webhook/platform/enforcement/namespaces/team-a/no-ephemeral-containers': value must be 'deny'"},
		{name: "rule name that is not one", args: []string{"--set", "webhook.platform.enforcement.rules.No_Privileged=deny"}, want: "'No_Privileged' does not match pattern"},
		{name: "namespace name that is not one", args: []string{"--set", "webhook.platform.enforcement.namespaces.Team_A.no-privileged=deny"}, want: "'Team_A' does not match pattern"},
		{name: "unknown enforcement key", args: []string{"--set", "webhook.platform.enforcement.rule.no-privileged=deny"}, want: "at '/webhook/platform/enforcement': additional properties 'rule' not allowed"},
		{name: "audit mode and a default action", args: []string{"--set", "webhook.auditMode=true", "--set", "webhook.platform.enforcement.default=dryrun"},
			want: "webhook.auditMode and webhook.platform.enforcement.default (dryrun) both set the action of every rule the platform does not name"},
		{name: "example memory quota not a quantity", args: []string{"--set", "queueing.kueue.examples.memory=lots"}, want: "/queueing/kueue/examples/memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := run(t, h, append([]string{"template", "rw", chart, "--namespace", "runwarden"}, tt.args...)...)
			if err == nil {
				t.Fatalf("helm template accepted %v", tt.args)
			}
			if !strings.Contains(out, tt.want) {
				t.Errorf("error does not mention %q:\n%s", tt.want, out)
			}
		})
	}
}

// TestDispatcherReplicas renders the dispatcher with several replica counts:
// every replica runs leader election on the Lease its Role may take, a
// rolling update starts the new pod before an old one stops, a standby
// counts as ready (or no rollout, helm --wait or drain would end while the
// leader lives), the replicas prefer different nodes, and more than one
// get a PodDisruptionBudget.
func TestDispatcherReplicas(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	defaultFlags := []string{"--leader-elect", "--leader-elect-namespace=runwarden", "--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=1s"}
	tests := []struct {
		name     string
		args     []string
		replicas int32
		flags    []string // the --leader-elect flags, in order
		budget   bool     // a PodDisruptionBudget for the dispatcher
	}{
		{name: "defaults", replicas: 2, flags: defaultFlags, budget: true},
		{name: "one replica elects too", args: []string{"--set", "dispatcher.replicas=1"}, replicas: 1, flags: defaultFlags},
		{name: "three replicas with their own timing", args: []string{"--set", "dispatcher.replicas=3",
			"--set", "dispatcher.leaderElection.leaseDuration=1m", "--set", "dispatcher.leaderElection.renewDeadline=40s", "--set", "dispatcher.leaderElection.retryPeriod=500ms"},
			replicas: 3, flags: []string{"--leader-elect", "--leader-elect-namespace=runwarden", "--leader-elect-lease-duration=1m", "--leader-elect-renew-deadline=40s", "--leader-elect-retry-period=500ms"}, budget: true},
		{name: "budgets off", args: []string{"--set", "podDisruptionBudget.enabled=false"}, replicas: 2, flags: defaultFlags},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, h, tt.args...)
			var d appsv1.Deployment
			decode(t, objs, "Deployment/rw-runwarden-dispatcher", &d)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != tt.replicas {
				t.Errorf("replicas %v, want %d", d.Spec.Replicas, tt.replicas)
			}
			zero, one := intstr.FromInt32(0), intstr.FromInt32(1)
			wantStrategy := appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &zero, MaxSurge: &one}}
			if diff := cmp.Diff(wantStrategy, d.Spec.Strategy); diff != "" {
				t.Errorf("strategy (-want +got):\n%s", diff)
			}

			c := d.Spec.Template.Spec.Containers[0]
			var flags []string
			arg := map[string]string{}
			for _, a := range c.Args {
				if strings.HasPrefix(a, "--leader-elect") {
					flags = append(flags, a)
				}
				if k, v, ok := strings.Cut(a, "="); ok {
					arg[k] = v
				}
			}
			if diff := cmp.Diff(tt.flags, flags); diff != "" {
				t.Errorf("leader election flags (-want +got):\n%s", diff)
			}
			probes := map[string]string{}
			for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
				if p != nil && p.HTTPGet != nil {
					probes[name] = p.HTTPGet.Path
				}
			}
			// /readyz fails on a standby: the readiness probe must not ask it.
			if diff := cmp.Diff(map[string]string{"liveness": "/healthz", "readiness": "/healthz"}, probes); diff != "" {
				t.Errorf("probe paths (-want +got):\n%s", diff)
			}

			selector := map[string]string{"app.kubernetes.io/name": "runwarden", "app.kubernetes.io/instance": "rw", "app.kubernetes.io/component": "dispatcher"}
			wantSpread := []corev1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{
				TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: selector}}}}
			var spread []corev1.WeightedPodAffinityTerm
			if a := d.Spec.Template.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
				spread = a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution
			}
			if diff := cmp.Diff(wantSpread, spread); diff != "" {
				t.Errorf("preferred pod anti-affinity (-want +got):\n%s", diff)
			}

			// The Lease named after --dispatcher-id is taken in
			// --leader-elect-namespace, the release's, where runner pods
			// have no rights; the Role in the runner namespace has no
			// lease rule (runner pods may write Leases there).
			rulesOf := func(name string) (ns string, leases, events []rbacv1.PolicyRule) {
				var role rbacv1.Role
				decode(t, objs, "Role/"+name, &role)
				for _, r := range role.Rules {
					if slices.Contains(r.Resources, "leases") || slices.Contains(r.APIGroups, "coordination.k8s.io") {
						leases = append(leases, r)
					}
					if slices.Contains(r.Resources, "events") {
						events = append(events, r)
					}
				}
				return role.Namespace, leases, events
			}
			ns, leases, events := rulesOf("rw-runwarden-dispatcher")
			if ns != arg["--namespace"] || len(leases) != 0 {
				t.Errorf("the runner namespace Role in %q (--namespace=%q) has lease rules %+v", ns, arg["--namespace"], leases)
			}
			// Listing events: a failed task's warnings.
			if diff := cmp.Diff([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}}}, events); diff != "" {
				t.Errorf("event rules of the dispatcher's Role (-want +got):\n%s", diff)
			}
			ns, leases, events = rulesOf("rw-runwarden-dispatcher-leader")
			if ns != "runwarden" || ns != arg["--leader-elect-namespace"] {
				t.Errorf("the leader election Role in %q, --leader-elect-namespace=%q, want the release namespace", ns, arg["--leader-elect-namespace"])
			}
			wantLeases := []rbacv1.PolicyRule{
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"runwarden-dispatcher-" + arg["--dispatcher-id"]}, Verbs: []string{"get", "update"}},
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
			}
			if diff := cmp.Diff(wantLeases, leases); diff != "" {
				t.Errorf("lease rules of the leader election Role (-want +got):\n%s", diff)
			}
			// The LeaderElection event on the Lease.
			if diff := cmp.Diff([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}, events); diff != "" {
				t.Errorf("event rules of the leader election Role (-want +got):\n%s", diff)
			}
			var binding rbacv1.RoleBinding
			decode(t, objs, "RoleBinding/rw-runwarden-dispatcher-leader", &binding)
			if binding.Namespace != "runwarden" || binding.RoleRef.Name != "rw-runwarden-dispatcher-leader" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "rw-runwarden-dispatcher" {
				t.Errorf("the leader election RoleBinding: %+v", binding)
			}

			doc, ok := objs["PodDisruptionBudget/rw-runwarden-dispatcher"]
			if ok != tt.budget {
				t.Fatalf("dispatcher PodDisruptionBudget rendered: %v, want %v", ok, tt.budget)
			}
			if !ok {
				return
			}
			var pdb policyv1.PodDisruptionBudget
			if err := yaml.Unmarshal([]byte(doc), &pdb); err != nil {
				t.Fatal(err)
			}
			wantPDB := policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: selector}}
			if diff := cmp.Diff(wantPDB, pdb.Spec); diff != "" {
				t.Errorf("dispatcher PodDisruptionBudget (-want +got):\n%s", diff)
			}
		})
	}
}

// The dispatcher is told the platform's secretDelivery, so its preflight
// knows whether a cluster without EnvFiles is a problem.
func TestDispatcherKnowsSecretDelivery(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "--secret-delivery=envFile"},
		{[]string{"--set", "webhook.platform.secretDelivery=files"}, "--secret-delivery=files"},
	} {
		var d appsv1.Deployment
		decode(t, render(t, h, tt.args...), "Deployment/rw-runwarden-dispatcher", &d)
		var got []string
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if strings.HasPrefix(a, "--secret-delivery") {
				got = append(got, a)
			}
		}
		if diff := cmp.Diff([]string{tt.want}, got); diff != "" {
			t.Errorf("with %q, the dispatcher's --secret-delivery (-want +got):\n%s", tt.args, diff)
		}
	}
}

// The webhook's policy deadline is half of timeoutSeconds, at most 2s, so
// a slow policy fails the call before the API server gives up on it; and
// the webhook knows its own pod, to report refused reloads on it.
func TestWebhookPolicyTimeoutAndPod(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "--policy-timeout=2000ms"},
		{[]string{"--set", "webhook.timeoutSeconds=1"}, "--policy-timeout=500ms"},
		{[]string{"--set", "webhook.timeoutSeconds=3"}, "--policy-timeout=1500ms"},
		{[]string{"--set", "webhook.timeoutSeconds=30"}, "--policy-timeout=2000ms"},
	} {
		var d appsv1.Deployment
		decode(t, render(t, h, tt.args...), "Deployment/rw-runwarden-webhook", &d)
		c := d.Spec.Template.Spec.Containers[0]
		var got []string
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--policy-timeout") || strings.HasPrefix(a, "--pod-") {
				got = append(got, a)
			}
		}
		want := []string{tt.want, "--pod-name=$(POD_NAME)", "--pod-namespace=$(POD_NAMESPACE)", "--pod-uid=$(POD_UID)"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("with %q, the webhook's flags (-want +got):\n%s", tt.args, diff)
		}
		fields := map[string]string{}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				fields[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		if diff := cmp.Diff(map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_UID": "metadata.uid"}, fields); diff != "" {
			t.Errorf("the webhook's downward API env (-want +got):\n%s", diff)
		}
	}
}

// TestExtraEnv: a component's extraEnv comes after the chart's own
// variables in its container, as given; none by default.
func TestExtraEnv(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	envOf := func(out map[string]string, name string) []corev1.EnvVar {
		var d appsv1.Deployment
		decode(t, out, "Deployment/rw-runwarden-"+name, &d)
		return d.Spec.Template.Spec.Containers[0].Env
	}
	names := func(env []corev1.EnvVar) []string {
		var n []string
		for _, e := range env {
			n = append(n, e.Name)
		}
		return n
	}
	plain := render(t, h)
	if diff := cmp.Diff([]string{"POD_NAME", "POD_NAMESPACE", "POD_UID"}, names(envOf(plain, "webhook"))); diff != "" {
		t.Errorf("the webhook's default env (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"POD_NAME"}, names(envOf(plain, "dispatcher"))); diff != "" {
		t.Errorf("the dispatcher's default env (-want +got):\n%s", diff)
	}
	out := render(t, h, "--set-json", `webhook.extraEnv=[{"name":"GOGC","value":"1000"},{"name":"NODE","valueFrom":{"fieldRef":{"fieldPath":"spec.nodeName"}}}]`,
		"--set-json", `dispatcher.extraEnv=[{"name":"GOMEMLIMIT","value":"200MiB"}]`)
	webhook := envOf(out, "webhook")
	wantWebhook := []corev1.EnvVar{{Name: "GOGC", Value: "1000"}, {Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}
	if diff := cmp.Diff([]string{"POD_NAME", "POD_NAMESPACE", "POD_UID", "GOGC", "NODE"}, names(webhook)); diff != "" {
		t.Fatalf("the webhook's env (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantWebhook, webhook[3:]); diff != "" {
		t.Errorf("the webhook's extra env (-want +got):\n%s", diff)
	}
	dispatcher := envOf(out, "dispatcher")
	if diff := cmp.Diff([]string{"POD_NAME", "GOMEMLIMIT"}, names(dispatcher)); diff != "" {
		t.Fatalf("the dispatcher's env (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]corev1.EnvVar{{Name: "GOMEMLIMIT", Value: "200MiB"}}, dispatcher[1:]); diff != "" {
		t.Errorf("the dispatcher's extra env (-want +got):\n%s", diff)
	}
}

// TestDispatcherQueueing checks the dispatcher's queueing flags and the
// rights and objects that go with them: none by default; without Kueue,
// one --priority-class per class, sorted by name, and the default class;
// with Kueue, --kueue, the default queue and --max-queued, and rules in the
// dispatcher's Role in the runner namespace to read Kueue's Workloads (and
// patch them: a Workload is deactivated before its Job is stopped) and
// LocalQueues (the preflight). The example queue, when on, is the default
// queue, in the namespace the dispatcher works in, open to it alone, and
// preempts nothing.
func TestDispatcherQueueing(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	kueueRules := []rbacv1.PolicyRule{
		{APIGroups: []string{"kueue.x-k8s.io"}, Resources: []string{"workloads"}, Verbs: []string{"get", "list", "patch"}},
		{APIGroups: []string{"kueue.x-k8s.io"}, Resources: []string{"localqueues"}, Verbs: []string{"get", "list"}},
	}
	kueue := []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=runners"}
	tests := []struct {
		name    string
		args    []string
		flags   []string            // the queueing flags, in order
		rules   []rbacv1.PolicyRule // the dispatcher Role's kueue.x-k8s.io rules
		objects []string            // the Kueue objects rendered, kind/name
		covered []string            // the example ClusterQueue's coveredResources
	}{
		{name: "defaults"},
		{name: "priority classes", args: []string{"--set", "queueing.priorityClasses.urgent=1000", "--set", "queueing.priorityClasses.batch=-10",
			"--set", "queueing.priorityClasses.routine=0", "--set", "queueing.defaultPriorityClass=routine"},
			flags: []string{"--priority-class=batch=-10", "--priority-class=routine=0", "--priority-class=urgent=1000", "--default-priority-class=routine"}},
		// The dispatcher refuses --default-queue without --kueue.
		{name: "kueue settings while kueue is off", args: []string{"--set", "queueing.kueue.defaultQueue=runners", "--set", "queueing.kueue.maxQueued=5"}},
		{name: "kueue", args: append(slices.Clone(kueue), "--set", "queueing.defaultPriorityClass=routine", "--set", "queueing.kueue.maxQueued=50"),
			flags: []string{"--kueue", "--default-queue=runners", "--max-queued=50", "--default-priority-class=routine"}, rules: kueueRules},
		{name: "kueue without a default queue", args: []string{"--set", "queueing.kueue.enabled=true"},
			flags: []string{"--kueue", "--max-queued=100"}, rules: kueueRules},
		{name: "kueue with the orchestrator source", args: append(slices.Clone(kueue), "--set", "dispatcher.taskSource=orchestrator",
			"--set", "dispatcher.orchestrator.url=https://orchestrator.example.com", "--set", "dispatcher.orchestrator.auth=exchange"),
			flags: []string{"--kueue", "--default-queue=runners", "--max-queued=100"}, rules: kueueRules},
		{name: "kueue with the examples", args: append(slices.Clone(kueue), "--set", "queueing.kueue.examples.enabled=true",
			"--set", "queueing.kueue.examples.priorityClasses.urgent=1000", "--set", "queueing.kueue.examples.priorityClasses.routine=100"),
			flags: []string{"--kueue", "--default-queue=runners", "--max-queued=100"}, rules: kueueRules,
			objects: []string{"ClusterQueue/rw-runwarden", "LocalQueue/runners", "ResourceFlavor/rw-runwarden", "WorkloadPriorityClass/routine", "WorkloadPriorityClass/urgent"},
			covered: []string{"cpu", "memory", "pods"}},
		{name: "example quota of pods alone", args: append(slices.Clone(kueue), "--set", "queueing.kueue.examples.enabled=true",
			"--set", "queueing.kueue.examples.cpu=", "--set", "queueing.kueue.examples.memory=", "--set", "queueing.kueue.examples.pods=3"),
			flags: []string{"--kueue", "--default-queue=runners", "--max-queued=100"}, rules: kueueRules,
			objects: []string{"ClusterQueue/rw-runwarden", "LocalQueue/runners", "ResourceFlavor/rw-runwarden"}, covered: []string{"pods"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, h, tt.args...)
			var d appsv1.Deployment
			decode(t, objs, "Deployment/rw-runwarden-dispatcher", &d)
			var flags []string
			arg := map[string]string{}
			for _, a := range d.Spec.Template.Spec.Containers[0].Args {
				for _, f := range []string{"--kueue", "--default-queue", "--max-queued", "--priority-class", "--default-priority-class"} {
					if a == f || strings.HasPrefix(a, f+"=") {
						flags = append(flags, a)
					}
				}
				if k, v, ok := strings.Cut(a, "="); ok {
					arg[k] = v
				}
			}
			if diff := cmp.Diff(tt.flags, flags); diff != "" {
				t.Errorf("queueing flags (-want +got):\n%s", diff)
			}

			var role rbacv1.Role
			decode(t, objs, "Role/rw-runwarden-dispatcher", &role)
			if role.Namespace != arg["--namespace"] {
				t.Errorf("the dispatcher's Role is in %q, not the runner namespace %q", role.Namespace, arg["--namespace"])
			}
			var rules []rbacv1.PolicyRule
			for _, r := range role.Rules {
				if slices.Contains(r.APIGroups, "kueue.x-k8s.io") {
					rules = append(rules, r)
				}
			}
			if diff := cmp.Diff(tt.rules, rules); diff != "" {
				t.Errorf("kueue.x-k8s.io rules of the dispatcher's Role (-want +got):\n%s", diff)
			}

			var objects []string
			for key, doc := range objs {
				var m struct{ APIVersion string }
				if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
					t.Fatalf("%s: %v", key, err)
				}
				if strings.HasPrefix(m.APIVersion, "kueue.x-k8s.io/") {
					if m.APIVersion != "kueue.x-k8s.io/v1beta2" {
						t.Errorf("%s is at %s, not kueue.x-k8s.io/v1beta2 (the version the dispatcher reads)", key, m.APIVersion)
					}
					objects = append(objects, key)
				}
			}
			slices.Sort(objects)
			if diff := cmp.Diff(tt.objects, objects); diff != "" {
				t.Fatalf("Kueue objects (-want +got):\n%s", diff)
			}
			if len(objects) == 0 {
				return
			}
			var lq struct {
				Metadata struct{ Name, Namespace string }
				Spec     struct{ ClusterQueue string }
			}
			decode(t, objs, "LocalQueue/"+arg["--default-queue"], &lq)
			if lq.Metadata.Namespace != arg["--namespace"] || lq.Spec.ClusterQueue != "rw-runwarden" {
				t.Errorf("the example LocalQueue %s is in %q for ClusterQueue %q; want the runner namespace %q and rw-runwarden",
					lq.Metadata.Name, lq.Metadata.Namespace, lq.Spec.ClusterQueue, arg["--namespace"])
			}
			var cq struct {
				Spec struct {
					NamespaceSelector metav1.LabelSelector
					ResourceGroups    []struct {
						CoveredResources []string
						Flavors          []struct {
							Name      string
							Resources []struct{ Name string }
						}
					}
					Preemption map[string]any
				}
			}
			decode(t, objs, "ClusterQueue/rw-runwarden", &cq)
			if diff := cmp.Diff(metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": arg["--namespace"]}}, cq.Spec.NamespaceSelector); diff != "" {
				t.Errorf("the example ClusterQueue's namespaceSelector (-want +got):\n%s", diff)
			}
			// A preempted runner is stopped mid-run, its state lock held.
			never := map[string]any{"withinClusterQueue": "Never", "reclaimWithinCohort": "Never", "borrowWithinCohort": map[string]any{"policy": "Never"}}
			if diff := cmp.Diff(never, cq.Spec.Preemption); diff != "" {
				t.Errorf("the example ClusterQueue's preemption (-want +got):\n%s", diff)
			}
			if len(cq.Spec.ResourceGroups) != 1 || len(cq.Spec.ResourceGroups[0].Flavors) != 1 {
				t.Fatalf("the example ClusterQueue has resource groups %+v; want one, with one flavor", cq.Spec.ResourceGroups)
			}
			rg := cq.Spec.ResourceGroups[0]
			var quotas []string // Kueue: one per covered resource, in the same order
			for _, r := range rg.Flavors[0].Resources {
				quotas = append(quotas, r.Name)
			}
			if diff := cmp.Diff(tt.covered, rg.CoveredResources); diff != "" || !slices.Equal(quotas, rg.CoveredResources) || rg.Flavors[0].Name != "rw-runwarden" {
				t.Errorf("the example ClusterQueue covers %v with flavor %s quotas %v; want %v, each with a quota of flavor rw-runwarden", rg.CoveredResources, rg.Flavors[0].Name, quotas, tt.covered)
			}
		})
	}
}

// render runs helm template with args and returns its objects by kind/name.
func render(t *testing.T, h string, args ...string) map[string]string {
	t.Helper()
	out, err := run(t, h, append([]string{"template", "rw", chart, "--namespace", "runwarden"}, args...)...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs := map[string]string{}
	for _, doc := range strings.Split(out, "\n---\n") {
		var m struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if m.Kind != "" {
			objs[m.Kind+"/"+m.Metadata.Name] = doc
		}
	}
	return objs
}

// decode unmarshals the rendered object key (kind/name) into obj.
func decode(t *testing.T, objs map[string]string, key string, obj any) {
	t.Helper()
	doc, ok := objs[key]
	if !ok {
		t.Fatalf("no %s rendered", key)
	}
	if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
}

// TestNotesWarnOfUnpublishedImages checks that the release notes name the
// images left at the chart's appVersion tag, which no registry holds. Helm v4
// renders the notes of a client-side dry run without a cluster.
func TestNotesWarnOfUnpublishedImages(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm4")
	digest := "sha256:" + strings.Repeat("ab", 32)
	tests := []struct {
		name string
		args []string
		want []string // the images the warning names; none: no warning
	}{
		{name: "defaults", want: []string{"localhost/runwarden/dispatcher:0.1.0", "localhost/runwarden/webhook:0.1.0", "localhost/runwarden/runner:0.1.0"}},
		{name: "runner tag only", args: []string{"--set", "images.runnerTag=r1"}, want: []string{"localhost/runwarden/dispatcher:0.1.0", "localhost/runwarden/webhook:0.1.0"}},
		{name: "webhook by digest", args: []string{"--set", "images.digests.webhook=" + digest}, want: []string{"localhost/runwarden/dispatcher:0.1.0", "localhost/runwarden/runner:0.1.0"}},
		{name: "tags set", args: []string{"--set", "images.tag=v1", "--set", "images.runnerTag=r1"}},
		{name: "one tag for all", args: []string{"--set", "images.tag=v1"}},
		{name: "dev mode runs none of them", args: []string{"--set", "webhook.devMode.enabled=true", "--set", "webhook.devMode.url=https://127.0.0.1:9443/mutate-pods"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := run(t, h, append([]string{"install", "rw", chart, "--namespace", "runwarden", "--dry-run=client"}, tt.args...)...)
			if err != nil {
				t.Fatalf("helm install --dry-run=client: %v\n%s", err, out)
			}
			_, notes, ok := strings.Cut(out, "\nNOTES:\n")
			if !ok {
				t.Fatalf("no NOTES in the output:\n%s", out)
			}
			var named []string
			if _, warning, ok := strings.Cut(notes, "WARNING:"); ok {
				warning, _, _ = strings.Cut(warning, "\n\n")
				for _, l := range strings.Split(warning, "\n") {
					if strings.HasPrefix(l, "  ") {
						named = append(named, strings.TrimSpace(l))
					}
				}
				if len(named) == 0 {
					t.Errorf("the warning names no image:\n%s", notes)
				}
			}
			if diff := cmp.Diff(tt.want, named); diff != "" {
				t.Errorf("images the notes warn of (-want +got):\n%s\n%s", diff, notes)
			}
		})
	}
}

// TestNamespacesRenderAsStrings renders with namespace names YAML would
// read as a number and a boolean (both valid names): every namespace the
// chart writes must come out a string, or the API server refuses the object.
func TestNamespacesRenderAsStrings(t *testing.T) {
	t.Parallel()
	out, err := run(t, helm(t, "helm3"), "template", "rw", chart, "--namespace", "123", "--set", "runnerNamespace=on",
		"--set", "runner.stateVolume.enabled=true", "--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.dashboards.enabled=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	checked := 0
	var walk func(kind, path string, v any)
	walk = func(kind, path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				p := path + "." + k
				switch {
				case k == "namespace" || (kind == "Namespace" && p == ".metadata.name"):
					checked++
					if _, ok := e.(string); !ok {
						t.Errorf("%s %s is %T %v, not a string", kind, p, e, e)
					}
				case k == "resourceNames" || k == "matchNames" || (k == "values" && strings.Contains(path, "namespaceSelector")):
					for _, n := range e.([]any) {
						checked++
						if _, ok := n.(string); !ok {
							t.Errorf("%s %s holds %T %v, not a string", kind, p, n, n)
						}
					}
				}
				walk(kind, p, e)
			}
		case []any:
			for _, e := range x {
				walk(kind, path+"[]", e)
			}
		}
	}
	for _, doc := range strings.Split(out, "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if m == nil {
			continue
		}
		kind, _ := m["kind"].(string)
		walk(kind, "", m)
	}
	if checked < 22 {
		t.Errorf("checked %d namespace values, want 22 at least", checked)
	}
}

// TestServiceAccountRights checks what the chart lets the dispatcher and
// the webhook do, as docs/security.md states it: neither may read, change
// or delete a Secret (the dispatcher may only create one), the dispatcher
// holds no cluster-wide right (Kueue's rules included), and the webhook
// writes nothing but its own webhook configurations, by name, and Events
// (on its own pod) in the release namespace.
func TestServiceAccountRights(t *testing.T) {
	t.Parallel()
	objs := render(t, helm(t, "helm3"), "--set", "runner.serviceAccount.stateBackendRole=true", "--set", "queueing.kueue.enabled=true")
	rules := map[string][]rbacv1.PolicyRule{} // by service account
	clusterWide := map[string]bool{}
	for key, doc := range objs {
		kind, _, _ := strings.Cut(key, "/")
		if kind != "RoleBinding" && kind != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.RoleBinding // a ClusterRoleBinding has the same fields
		if err := yaml.Unmarshal([]byte(doc), &b); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		var role rbacv1.Role
		decode(t, objs, b.RoleRef.Kind+"/"+b.RoleRef.Name, &role)
		for _, s := range b.Subjects {
			rules[s.Name] = append(rules[s.Name], role.Rules...)
			if kind == "ClusterRoleBinding" {
				clusterWide[s.Name] = true
			}
		}
	}
	for _, sa := range []string{"rw-runwarden-dispatcher", "rw-runwarden-webhook"} {
		if len(rules[sa]) == 0 {
			t.Fatalf("no rules bound to %s", sa)
		}
		for _, r := range rules[sa] {
			if !slices.Contains(r.Resources, "secrets") {
				continue
			}
			if sa != "rw-runwarden-dispatcher" || !slices.Equal(r.Verbs, []string{"create"}) {
				t.Errorf("%s has %v on Secrets; want the dispatcher's create alone", sa, r.Verbs)
			}
		}
	}
	if clusterWide["rw-runwarden-dispatcher"] {
		t.Error("the dispatcher is bound to a ClusterRole")
	}
	// The runner pod template: the dispatcher reads its own by name, and
	// writes no PodTemplate.
	for _, r := range rules["rw-runwarden-dispatcher"] {
		if slices.Contains(r.Resources, "podtemplates") && (!slices.Equal(r.Verbs, []string{"get", "list", "watch"}) || !slices.Equal(r.ResourceNames, []string{"rw-runwarden-runner"})) {
			t.Errorf("the dispatcher may %v podtemplates %v; want get, list and watch on rw-runwarden-runner alone", r.Verbs, r.ResourceNames)
		}
	}
	readsPods := false
	for _, r := range rules["rw-runwarden-webhook"] {
		if slices.Contains(r.Resources, "pods") {
			// The pod of an exec, attach or port-forward, read by name:
			// never a cache of every pod of the namespace.
			readsPods = slices.Equal(r.Verbs, []string{"get"}) && slices.Equal(r.APIGroups, []string{""})
			if !readsPods {
				t.Errorf("the webhook may %v %v %v; want get on pods alone", r.Verbs, r.APIGroups, r.Resources)
			}
		}
		for _, v := range r.Verbs {
			if v == "get" || v == "list" || v == "watch" {
				continue
			}
			// A refused policy reload is an Event on its pod; the Role is
			// checked below to be the release namespace's.
			if (v == "create" || v == "patch") && slices.Equal(r.APIGroups, []string{""}) && slices.Equal(r.Resources, []string{"events"}) && len(r.ResourceNames) == 0 {
				continue
			}
			if v != "patch" || len(r.ResourceNames) != 1 || r.ResourceNames[0] != "rw-runwarden" ||
				!slices.Equal(r.Resources, []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}) {
				t.Errorf("the webhook may %s %v %v; want writes to its own webhook configurations and Events alone", v, r.Resources, r.ResourceNames)
			}
		}
	}
	var events rbacv1.Role
	decode(t, objs, "Role/rw-runwarden-webhook-events", &events)
	if events.Namespace != "runwarden" || !cmp.Equal(events.Rules, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}) {
		t.Errorf("the webhook's Events Role: namespace %q, rules %+v; want create and patch of events in the release namespace alone", events.Namespace, events.Rules)
	}
	var binding rbacv1.RoleBinding
	decode(t, objs, "RoleBinding/rw-runwarden-webhook-events", &binding)
	if binding.Namespace != "runwarden" || binding.RoleRef.Kind != "Role" {
		t.Errorf("the webhook's Events binding: namespace %q, role %s; want a RoleBinding of the Role in the release namespace", binding.Namespace, binding.RoleRef.Kind)
	}
	if !readsPods {
		t.Error("the webhook may not get pods: it cannot tell whether an exec, attach or port-forward reaches a runner pod")
	}
}

// TestWorkloadIdentityChart checks what the chart adds for workload
// identity: the webhook may read the role mapping ConfigMap the platform
// names, that one by name and nothing else of its namespace, and the runner
// pod template carries Azure's opt-in label while Azure's inject mode is on
// (docs/policy.md, "Azure's opt-in label"), and not in label mode.
func TestWorkloadIdentityChart(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`webhook:
  platform:
    workloadIdentity:
      aws: {enabled: true, roleMappingConfigMap: {namespace: kube-system, name: pod-identity-webhook},
            podIdentity: {associations: [{namespace: runwarden-runners, serviceAccount: runwarden-runner}]}}
      azure: {enabled: true}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := render(t, h, "-f", values)
	var role rbacv1.Role
	decode(t, objs, "Role/rw-runwarden-webhook-role-mapping", &role)
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"pod-identity-webhook"}, Verbs: []string{"get", "list", "watch"}}}
	if diff := cmp.Diff(want, role.Rules); role.Namespace != "kube-system" || diff != "" {
		t.Errorf("role mapping Role in %q (-want +got):\n%s", role.Namespace, diff)
	}
	var binding rbacv1.RoleBinding
	decode(t, objs, "RoleBinding/rw-runwarden-webhook-role-mapping", &binding)
	if binding.Namespace != "kube-system" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "rw-runwarden-webhook" {
		t.Errorf("role mapping RoleBinding %+v, want the webhook's service account in kube-system", binding)
	}
	var tpl corev1.PodTemplate
	decode(t, objs, "PodTemplate/rw-runwarden-runner", &tpl)
	if got := tpl.Template.Labels["azure.workload.identity/use"]; got != "true" {
		t.Errorf("runner pod template label azure.workload.identity/use %q, want true in inject mode", got)
	}

	plain := render(t, h, "--set", "webhook.platform.workloadIdentity.azure.enabled=true", "--set", "webhook.platform.workloadIdentity.azure.mode=label")
	if _, ok := plain["Role/rw-runwarden-webhook-role-mapping"]; ok {
		t.Error("a role mapping Role without a role mapping ConfigMap named")
	}
	var labelMode corev1.PodTemplate
	decode(t, plain, "PodTemplate/rw-runwarden-runner", &labelMode)
	if _, ok := labelMode.Template.Labels["azure.workload.identity/use"]; ok {
		t.Error("the runner pod template carries azure.workload.identity/use in label mode")
	}
}

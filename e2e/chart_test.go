//go:build e2e

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/k8s/resources"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/e2e/harness"
	"github.com/runwarden/runwarden/internal/memlimit"
)

// TestChartInstallsAndRunsTasks installs charts/runwarden with real Helm v4
// through the runwarden-postrender plugin and an overlay from kustomize/,
// its Deployments running as real pods, and runs a task through it.
func TestChartInstallsAndRunsTasks(t *testing.T) {
	t.Parallel()
	f := features.New("chart installs and runs tasks").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			if suite.Kind != harness.ClusterLocal {
				t.Skip("skipped: the release is pushed to the local cluster's registry (hack/registry.sh), which only its node trusts")
			}
			return ctx
		}).
		Assess("install, run a task, shape its pod", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			runners := ns + "-runners"
			_, plugins := buildPostrender(ctx, t)
			// The release, made as `make release` makes it: every image for
			// two platforms, signed, with SBOMs, and the chart with the
			// images' digests, pushed to the local registry. The chart is
			// installed from there, and the node pulls its images from there.
			rel, err := suite.Release(ctx, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			verifyRelease(ctx, t, rel)
			sameDigestAgain(ctx, t, rel, "webhook", "arm64")
			// The chart is installed by the digest that was verified, never
			// by its tag: a chart pushed to the tag after the verify (as
			// whoever may write to the registry could) is not installed.
			unsigned := pushOverTheTag(ctx, t, cfg, rel)
			chart := rel.ChartByDigest()
			values := []string{
				"--ca-file", rel.CAFile,
				"-f", filepath.Join(suite.RepoRoot, "hack", "demo", "values.yaml"),
				"--set", "runnerNamespace=" + runners,
			}
			release := "rw-" + ns[len(ns)-6:]
			// The helm v4 install's overlay: kustomize/labels' changes, and
			// for runner pods (the chart's PodTemplate) the runner image's
			// tag (the chart is given one the node does not hold: only the
			// rewrite lets a runner start) and a toleration.
			overlay := t.TempDir()
			labels, err := os.ReadFile(filepath.Join(suite.RepoRoot, "kustomize", "labels", "kustomization.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			runnerImage := rel.Images["runner"].Ref
			kustomization := string(labels) + fmt.Sprintf(`images:
- name: %s
  newTag: %q
patches:
- target: {kind: PodTemplate}
  patch: |
    - op: add
      path: /template/spec/tolerations
      value: [{key: example.com/overlay, operator: Exists, effect: NoSchedule}]
`, rel.Images["runner"].Repository(), rel.Version)
			if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
				t.Fatal(err)
			}

			// The API server accepts every object (server-side dry run, Helm v3).
			h3 := newHelm(t, cfg, "helm3")
			if out, err := h3.run(ctx, append([]string{"install", release, chart, "-n", ns, "--dry-run=server"}, values...)...); err != nil {
				t.Fatalf("server-side dry run: %v\n%s", err, out)
			}

			h4 := newHelm(t, cfg, "helm4")
			h4.plugins = plugins
			args := append([]string{"install", release, chart, "-n", ns, "--wait", "--timeout", "5m",
				"--post-renderer", "runwarden-postrender", "--post-renderer-args", "--kustomize",
				"--post-renderer-args", overlay}, values...)
			// The runner by a tag only the overlay rewrites (the chart pins it
			// by digest, so the pin is lifted for this).
			args = append(args, "--set", "images.digests.runner=null", "--set", "images.runnerTag=only-the-overlay-knows")
			// The runner container's proxy and extra CA.
			args = append(args, "--set", `runner.proxy.noProxy=.svc\,.cluster.local`, "--set", "runner.caBundle.configMap=corporate-ca")
			t.Cleanup(func() {
				_, _ = h4.run(context.Background(), "uninstall", release, "-n", ns, "--wait")
				_ = cfg.Client().Resources().Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: runners}})
			})
			out, err := h4.run(ctx, args...)
			if err != nil {
				t.Fatalf("helm v4 install: %v\n%s", err, out)
			}
			// Helm pulled the signed chart, and what it installed is that
			// chart, not the one now under its tag.
			if !strings.Contains(out, "Digest: "+rel.Chart.Digest+"\n") {
				t.Errorf("helm v4 install did not pull the signed chart %s (the tag names %s):\n%s", rel.Chart.Digest, unsigned, out)
			}
			installedSigned(ctx, t, h4, release, ns, rel)
			var pods corev1.PodList
			if err := cfg.Client().Resources(ns).List(ctx, &pods); err != nil {
				t.Fatal(err)
			}
			// One of the two dispatcher replicas holds the release's Lease,
			// in the release namespace (its identity starts with its pod's
			// name).
			lease := "runwarden-dispatcher-" + release + "-runwarden"
			holder, err := suite.Kubectl(ctx, cfg, "get", "lease", "-n", ns, lease, "-o", "jsonpath={.spec.holderIdentity}")
			dispatchers := 0
			for _, p := range pods.Items {
				if p.Labels["app.kubernetes.io/component"] == "dispatcher" {
					dispatchers++
					if err == nil && strings.HasPrefix(holder, p.Name+"_") {
						holder = "pod " + p.Name
					}
				}
			}
			if err != nil || dispatchers != 2 || !strings.HasPrefix(holder, "pod ") {
				t.Errorf("the dispatcher Lease's holder %q (%v), among %d dispatcher pods: want one of them", holder, err, dispatchers)
			}
			// A task's pod may write Leases in the runner namespace (the demo
			// turns the state backend Role on), never the dispatcher's: a
			// task holding it would stop every replica.
			runner := "system:serviceaccount:" + runners + ":runwarden-runner"
			for _, c := range []struct{ verb, ns, name, want string }{
				{"update", runners, "lock-tfstate-default-state", "yes"},
				{"update", ns, lease, "no"},
				{"delete", ns, lease, "no"},
				{"create", ns, "", "no"},
			} {
				resource := "leases.coordination.k8s.io"
				if c.name != "" {
					resource += "/" + c.name
				}
				out, _ := suite.Kubectl(ctx, cfg, "auth", "can-i", c.verb, resource, "-n", c.ns, "--as", runner)
				if got := strings.TrimSpace(out); got != c.want {
					t.Errorf("may the runner service account %s lease %q in %s: %q, want %q", c.verb, c.name, c.ns, got, c.want)
				}
			}
			for _, p := range pods.Items {
				if p.Spec.NodeName != "rw-real-0" || p.Status.Phase != corev1.PodRunning {
					t.Errorf("pod %s: node %q phase %s, want running on the real node", p.Name, p.Spec.NodeName, p.Status.Phase)
				}
				// Each release pod runs its component's released image, by
				// its digest, as the node pulled it from the registry; every
				// container of it (init and ephemeral ones too) runs a
				// released image; and what each pulled verifies against the
				// release's key.
				released := rel.Images[p.Labels["app.kubernetes.io/component"]]
				if len(p.Spec.Containers) == 0 || released.Digest == "" || p.Spec.Containers[0].Image != released.ByDigest() {
					t.Errorf("pod %s: containers %+v; want the first to be the release's %q", p.Name, p.Spec.Containers, released.ByDigest())
				}
				for _, bad := range harness.UnreleasedContainers(&p, rel.ImagesByDigest()) {
					t.Error(bad)
				}
				for _, pulled := range pulledImages(&p) {
					if out, err := suite.Cosign(ctx, rel, "verify", "--key", filepath.Join(rel.Dir, "cosign.pub"), "--insecure-ignore-tlog", pulled); err != nil {
						t.Errorf("cosign verify of what pod %s pulled: %v", p.Name, err)
					} else {
						t.Logf("pod %s pulled %s; cosign verify: %d signature(s)", p.Name, pulled, strings.Count(out, `"critical"`))
					}
				}
				if p.Labels["platform.example.com/team"] != "platform" {
					t.Errorf("pod %s lacks the overlay's label: %v", p.Name, p.Labels)
				}
				// The Go runtime knows the container's memory limit
				// (internal/memlimit): memlimit.Ratio of it, as its start says.
				if lim := p.Spec.Containers[0].Resources.Limits.Memory(); !lim.IsZero() {
					want := fmt.Sprintf(`"goMemoryLimit":%d`, int64(float64(lim.Value())*memlimit.Ratio))
					logs, err := harness.PodLogs(ctx, cfg, p.Namespace, p.Name, p.Spec.Containers[0].Name)
					if err != nil || !strings.Contains(logs, want) {
						t.Errorf("pod %s (memory limit %s): no %s in its log (%v):\n%s", p.Name, lim, want, err, tail(logs, 2000))
					}
				}
			}

			r := cfg.Client().Resources(runners)
			ca := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "corporate-ca", Namespace: runners},
				Data: map[string]string{"ca.crt": testCA(t)}}
			if err := r.Create(ctx, ca); err != nil {
				t.Fatal(err)
			}
			rt := runnerTask(runners, "hello", `echo "$GREETING from the chart"
test "$NO_PROXY" = .svc,.cluster.local && test "$no_proxy" = "$NO_PROXY" || { echo "no proxy settings: $NO_PROXY"; exit 1; }
test "$SSL_CERT_DIR" = /etc/ssl/certs:/etc/runwarden/ca || { echo "SSL_CERT_DIR=$SSL_CERT_DIR"; exit 1; }
grep -q "BEGIN CERTIFICATE" /etc/runwarden/ca/ca.crt || { echo "the CA bundle is not mounted"; exit 1; }`)
			if err := r.Create(ctx, rt); err != nil {
				t.Fatal(err)
			}
			done := conditions.New(r).ResourceMatch(rt, func(o k8s.Object) bool {
				p := o.(*v1alpha1.RunnerTask).Status.Phase
				return p == v1alpha1.PhaseSucceeded || p == v1alpha1.PhaseFailed
			})
			if err := harness.WaitFor(ctx, "RunnerTask hello to finish", 2*time.Minute, done); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, rt.Name, runners, rt); err != nil {
				t.Fatal(err)
			}
			if rt.Status.Phase != v1alpha1.PhaseSucceeded {
				t.Fatalf("task: %+v", rt.Status)
			}
			// The chart's Role lets the dispatcher mark the Job reported
			// (a patch), which gives it its TTL.
			settledJob(ctx, t, cfg, batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: runners, Name: rt.Status.JobName}})
			logs, err := suite.Kubectl(ctx, cfg, "logs", "-n", runners, "job/"+rt.Status.JobName)
			if err != nil || logs != "hello from the chart\n" {
				t.Errorf("task logs %q, %v", logs, err)
			}
			var runnerPods corev1.PodList
			if err := r.List(ctx, &runnerPods, func(o *metav1.ListOptions) { o.LabelSelector = "batch.kubernetes.io/job-name=" + rt.Status.JobName }); err != nil || len(runnerPods.Items) != 1 {
				t.Fatalf("runner pods: %d, %v", len(runnerPods.Items), err)
			}
			p := runnerPods.Items[0]
			if envOf(&p)["AWS_ROLE_ARN"] != "arn:aws:iam::111122223333:role/demo-runner" || p.Annotations["karpenter.sh/do-not-disrupt"] != "true" {
				t.Errorf("runner pod not shaped by the chart's webhook: env %v, annotations %v", envOf(&p), p.Annotations)
			}
			// The overlay reached the runner pod through the PodTemplate.
			if got := p.Status.ContainerStatuses; len(got) != 1 || got[0].ImageID != rel.Images["runner"].ByDigest() {
				t.Errorf("runner pod container statuses %+v; want the released runner pulled by its tag, %s", got, rel.Images["runner"].ByDigest())
			}
			if p.Spec.Containers[0].Image != runnerImage || !slices.ContainsFunc(p.Spec.Tolerations, func(tl corev1.Toleration) bool { return tl.Key == "example.com/overlay" }) {
				t.Errorf("runner pod image %q, tolerations %+v; want the overlay's %q and its toleration", p.Spec.Containers[0].Image, p.Spec.Tolerations, runnerImage)
			}
			// The task's record: what ran, kept in its status.
			rec := rt.Status.Record
			switch {
			case rec == nil:
				t.Error("the finished task has no record")
			case !strings.HasPrefix(rec.SpecDigest, "sha256:") || rec.SpecDigest != p.Annotations["runwarden.dev/spec-digest"] ||
				rec.ShortSpecDigest != strings.TrimPrefix(rec.SpecDigest, "sha256:")[:12]:
				t.Errorf("record spec digest %q (short %q), pod's %q", rec.SpecDigest, rec.ShortSpecDigest, p.Annotations["runwarden.dev/spec-digest"])
			case rec.PolicyDigest == "" || !strings.HasPrefix(rec.TemplateDigest, "sha256:") || rec.Node != "rw-real-0" || rec.Pod != p.Name ||
				rec.StartedAt == nil || rec.FinishedAt == nil || rec.FinishedAt.Before(rec.StartedAt):
				t.Errorf("record %+v, want the policy and template digests, the real node and the pod", rec)
			case !slices.Contains(rec.Mutations, "env AWS_ROLE_ARN") || len(rec.Images) == 0 ||
				slices.ContainsFunc(rec.Images, func(i v1alpha1.ImageRecord) bool { return !strings.Contains(i.ImageID, "sha256:") }):
				t.Errorf("record mutations %v, images %+v; want the identity's env and each image's digest", rec.Mutations, rec.Images)
			default:
				t.Logf("the task's record: spec %s, policies %s, template %s, node %s, images %+v, mutations %v",
					rec.ShortSpecDigest, rec.PolicyDigest, job.Short(rec.TemplateDigest), rec.Node, rec.Images, rec.Mutations)
			}
			wide, err := suite.Kubectl(ctx, cfg, "get", "runnertask", "-n", runners, rt.Name, "-o", "wide")
			if err != nil || rec == nil || !strings.Contains(wide, rec.ShortSpecDigest) || !strings.Contains(wide, "POLICIES") {
				t.Errorf("kubectl get -o wide (%v):\n%s", err, wide)
			}

			// The dispatcher's pod replaced while a task runs: the new pod
			// (same dispatcher ID, the release's) carries on with the Job.
			across := runnerTask(runners, "across-restart", `sleep 10; echo "done"`)
			if err := r.Create(ctx, across); err != nil {
				t.Fatal(err)
			}
			started := conditions.New(r).ResourceMatch(across, func(o k8s.Object) bool {
				return o.(*v1alpha1.RunnerTask).Status.JobName != ""
			})
			if err := harness.WaitFor(ctx, "task across-restart to get a Job", time.Minute, started); err != nil {
				t.Fatal(err)
			}
			if out, err := suite.Kubectl(ctx, cfg, "delete", "pod", "-n", ns, "--wait=true",
				"-l", "app.kubernetes.io/instance="+release+",app.kubernetes.io/component=dispatcher"); err != nil {
				t.Fatalf("deleting the dispatcher's pod: %v\n%s", err, out)
			}
			finishedAcross := conditions.New(r).ResourceMatch(across, func(o k8s.Object) bool {
				return o.(*v1alpha1.RunnerTask).Status.Phase == v1alpha1.PhaseSucceeded
			})
			if err := harness.WaitFor(ctx, "task across-restart to succeed under the new dispatcher pod", 2*time.Minute, finishedAcross); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, across.Name, runners, across); err != nil {
				t.Fatal(err)
			}
			settledJob(ctx, t, cfg, batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: runners, Name: across.Status.JobName}})
			if jobs := jobsFor(ctx, t, cfg, runners, runners+"/"+across.Name+"/"+string(across.UID)); len(jobs) != 1 {
				t.Errorf("task across-restart has %d Jobs, want 1", len(jobs))
			}

			// The PodTemplate edited in place: the next task runs with it, no
			// restart. An edit that is no runner template is refused and the
			// last good one stays.
			template := release + "-runwarden-runner"
			// Each edit is awaited in the leading dispatcher's log, which
			// names every version of the PodTemplate it takes or refuses:
			// a task made before would run the old template.
			edit := func(patch string) {
				t.Helper()
				version, err := suite.Kubectl(ctx, cfg, "patch", "podtemplate", "-n", ns, template, "--type", "json", "-p", patch,
					"-o", "jsonpath={.metadata.resourceVersion}")
				if err != nil {
					t.Fatalf("editing the PodTemplate: %v\n%s", err, version)
				}
				if err := harness.WaitFor(ctx, "the leading dispatcher to read PodTemplate version "+version, time.Minute,
					templateVersionSeen(cfg, ns, lease, version)); err != nil {
					t.Fatal(err)
				}
			}
			edit(`[{"op": "add", "path": "/template/spec/containers/0/env", "value": [{"name": "GREETING", "value": "edited"}]}]`)
			runEcho := func(name string) string {
				t.Helper()
				task := runnerTask(runners, name, `echo "$GREETING"`)
				task.Spec.Env = nil
				if err := r.Create(ctx, task); err != nil {
					t.Fatal(err)
				}
				done := conditions.New(r).ResourceMatch(task, func(o k8s.Object) bool {
					return terminalPhase(o.(*v1alpha1.RunnerTask).Status.Phase)
				})
				if err := harness.WaitFor(ctx, "RunnerTask "+name+" to finish", 2*time.Minute, done); err != nil {
					t.Fatal(err)
				}
				if err := r.Get(ctx, task.Name, runners, task); err != nil {
					t.Fatal(err)
				}
				if task.Status.LogConfigMap == "" {
					t.Fatalf("task %s: %+v", name, task.Status)
				}
				out, err := suite.Kubectl(ctx, cfg, "get", "configmap", "-n", runners, task.Status.LogConfigMap, "-o", "jsonpath={.data.log}")
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSpace(out)
			}
			if got := runEcho("after-edit"); got != "edited" {
				t.Errorf("a task after the PodTemplate's edit printed %q, want the edited template's %q", got, "edited")
			}
			edit(`[{"op": "replace", "path": "/template/spec/containers/0/name", "value": "not-main"}]`)
			if got := runEcho("after-broken-edit"); got != "edited" {
				t.Errorf("a task after a broken edit printed %q, want the last good template's %q", got, "edited")
			}
			logs, err = suite.Kubectl(ctx, cfg, "logs", "-n", ns, "-l", "app.kubernetes.io/instance="+release+",app.kubernetes.io/component=dispatcher", "--tail", "-1")
			if err != nil || !strings.Contains(logs, "not a valid runner template; the last good one stays in force") {
				t.Errorf("the dispatchers' logs do not name the refused edit (%v)", err)
			}
			edit(`[{"op": "replace", "path": "/template/spec/containers/0/name", "value": "main"}]`)

			// The same chart, another release, with Helm v3 and the post-renderer binary.
			bin, _ := buildPostrender(ctx, t)
			release3 := release + "-v3"
			values3 := append(append([]string{}, values...), "--set", "runnerNamespace="+runners+"-v3")
			t.Cleanup(func() {
				_, _ = h3.run(context.Background(), "uninstall", release3, "-n", ns, "--wait")
				_ = cfg.Client().Resources().Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: runners + "-v3"}})
			})
			args3 := append([]string{"install", release3, chart, "-n", ns, "--wait", "--timeout", "5m",
				"--post-renderer", bin, "--post-renderer-args", "--kustomize",
				"--post-renderer-args", filepath.Join(suite.RepoRoot, "kustomize", "labels")}, values3...)
			if out, err := h3.run(ctx, args3...); err != nil {
				t.Fatalf("helm v3 install: %v\n%s", err, out)
			}
			installedSigned(ctx, t, h3, release3, ns, rel)
			out, err = suite.Kubectl(ctx, cfg, "get", "deployments", "-n", ns, "-l", "app.kubernetes.io/instance="+release3,
				"-o", `jsonpath={range .items[*]}{.metadata.name}={.status.readyReplicas}/{.metadata.labels.platform\.example\.com/team} {end}`)
			// Two replicas each (the defaults). Both dispatcher replicas are
			// ready: the chart's readiness probe is /healthz, so a standby
			// does not hold up a rollout or helm --wait.
			if err != nil || !strings.Contains(out, release3+"-runwarden-dispatcher=2/platform ") || !strings.Contains(out, release3+"-runwarden-webhook=2/platform ") {
				t.Errorf("helm v3 release deployments (name=ready/overlay label): %q, %v", out, err)
			}

			// helm test: a runner pod created through the webhook checks its own shape.
			// --logs: the test pod's log (the runner's, or the dispatcher's
			// reason it could not run one) is part of the answer.
			if out, err := h4.run(ctx, "test", release, "-n", ns, "--timeout", "3m", "--logs"); err != nil || !strings.Contains(out, "Succeeded") {
				t.Errorf("helm test: %v\n%s", err, out)
			}

			// A task whose pod the policies refuse fails with the rule in its message.
			refused := runnerTask(runners, "refused", "true")
			refused.Spec.Image = "docker.io/library/busybox:1.36"
			if err := r.Create(ctx, refused); err != nil {
				t.Fatal(err)
			}
			finished := conditions.New(r).ResourceMatch(refused, func(o k8s.Object) bool {
				return o.(*v1alpha1.RunnerTask).Status.Phase == v1alpha1.PhaseFailed
			})
			if err := harness.WaitFor(ctx, "RunnerTask refused to fail", 2*time.Minute, finished); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, refused.Name, runners, refused); err != nil {
				t.Fatal(err)
			}
			if refused.Status.Reason != "AdmissionRejected" || !strings.Contains(refused.Status.Message, "allowed-registries") {
				t.Errorf("refused task: %+v", refused.Status)
			}
			// Every metric the chart's dashboard and alerts name is served
			// by the release's pods (read from their /metrics through the
			// API server's proxy), now that tasks ran, one was refused and
			// the template was edited.
			served := map[string]bool{}
			var podList corev1.PodList
			if err := cfg.Client().Resources(ns).List(ctx, &podList, resources.WithLabelSelector("app.kubernetes.io/instance="+release)); err != nil {
				t.Fatal(err)
			}
			for _, p := range podList.Items {
				if p.Status.Phase != corev1.PodRunning {
					continue
				}
				out, err := suite.Kubectl(ctx, cfg, "get", "--raw", "/api/v1/namespaces/"+ns+"/pods/"+p.Name+":8080/proxy/metrics")
				if err != nil {
					t.Errorf("metrics of pod %s: %v", p.Name, err)
					continue
				}
				for _, line := range strings.Split(out, "\n") {
					if name, ok := strings.CutPrefix(line, "# HELP "); ok {
						served[strings.Fields(name)[0]] = true
					}
				}
			}
			for _, file := range []string{"dashboard.json", "rules.yaml"} {
				b, err := os.ReadFile(filepath.Join(suite.RepoRoot, "charts", "runwarden", "monitoring", file))
				if err != nil {
					t.Fatal(err)
				}
				for _, name := range regexp.MustCompile(`runwarden_[a-z_]+`).FindAllString(string(b), -1) {
					base := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(name, "")
					if !served[name] && !served[base] {
						t.Errorf("%s names %s, which no pod of the release serves", file, name)
					}
				}
			}

			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// templateVersionSeen is a condition: the dispatcher pod that holds Lease
// lease in ns has logged taking, or refusing, version of its PodTemplate.
func templateVersionSeen(cfg *envconf.Config, ns, lease, version string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		var l coordinationv1.Lease
		if err := cfg.Client().Resources(ns).Get(ctx, lease, ns, &l); err != nil || l.Spec.HolderIdentity == nil {
			return false, nil
		}
		// The identity is the pod's name, "_", a unique suffix.
		pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
		logs, err := harness.PodLogs(ctx, cfg, ns, pod, "dispatcher")
		if err != nil {
			return false, nil
		}
		for line := range strings.Lines(logs) {
			if strings.Contains(line, "pod template") && strings.Contains(line, `"resourceVersion":"`+version+`"`) {
				return true, nil
			}
		}
		return false, nil
	}
}

// testCA is a self-signed CA certificate, PEM.
func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "corporate CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// verifyRelease checks what `make release` pushed, as a user would before
// installing it: the chart and every image verify against the release's
// key, every image has both platforms, and each platform's image carries a
// signed SBOM that lists what is in it.
func verifyRelease(ctx context.Context, t *testing.T, rel *harness.Release) {
	t.Helper()
	pub := filepath.Join(rel.Dir, "cosign.pub")
	verify := []string{"--key", pub, "--insecure-ignore-tlog"}
	// The chart by the digest it is installed by.
	chart := strings.TrimPrefix(rel.ChartByDigest(), "oci://")
	if !strings.HasPrefix(rel.Chart.Digest, "sha256:") {
		t.Errorf("release.json's chart digest %q is not a sha256 digest", rel.Chart.Digest)
	}
	if _, err := suite.Cosign(ctx, rel, append(append([]string{"verify"}, verify...), chart)...); err != nil {
		t.Errorf("cosign verify of the chart: %v", err)
	}
	// What each image's SBOM must name: runwarden's own module in its
	// programs, busybox and OpenTofu in the runner.
	contents := map[string][]string{
		"dispatcher": {"github.com/runwarden/runwarden", "k8s.io/client-go"},
		"webhook":    {"github.com/runwarden/runwarden", "github.com/open-policy-agent/opa"},
		"postrender": {"github.com/runwarden/runwarden", "sigs.k8s.io/kustomize/api"},
		"runner":     {"busybox", "github.com/opentofu/opentofu"},
	}
	for name, want := range contents {
		im, ok := rel.Images[name]
		if !ok {
			t.Errorf("the release has no %s image: %+v", name, rel.Images)
			continue
		}
		if len(im.Platforms) != 2 || im.Platforms["linux/amd64"] == "" || im.Platforms["linux/arm64"] == "" {
			t.Errorf("image %s has platforms %v, want linux/amd64 and linux/arm64", name, im.Platforms)
		}
		if _, err := suite.Cosign(ctx, rel, append(append([]string{"verify"}, verify...), im.Ref)...); err != nil {
			t.Errorf("cosign verify of %s: %v", im.Ref, err)
		}
		for plat, digest := range im.Platforms {
			ref := im.Repository() + "@" + digest
			out, err := suite.Cosign(ctx, rel, append(append([]string{"verify-attestation", "--type", "spdxjson"}, verify...), ref)...)
			if err != nil {
				t.Errorf("cosign verify-attestation of the %s SBOM of %s: %v", plat, name, err)
				continue
			}
			sbom := decodeAttestation(t, out)
			for _, w := range want {
				if !strings.Contains(sbom, w) {
					t.Errorf("the %s SBOM of %s does not name %s", plat, name, w)
				}
			}
		}
	}
	// Any other key, or an image the release did not sign, does not verify.
	if _, err := suite.Cosign(ctx, rel, "verify", "--key", otherCosignKey(ctx, t, rel), "--insecure-ignore-tlog", rel.Images["webhook"].Ref); err == nil {
		t.Error("cosign verify with another key passed")
	}
}

// unsignedAnnotation marks the chart pushOverTheTag pushes.
const unsignedAnnotation = "runwarden.dev/unsigned"

// pushOverTheTag pushes a chart that was never signed (the release's package
// with an annotation added) under the signed chart's tag, as whoever may
// write to the registry could between a user's verify and install, and
// returns its digest. When the test ends the tag names the signed chart
// again.
func pushOverTheTag(ctx context.Context, t *testing.T, cfg *envconf.Config, rel *harness.Release) string {
	t.Helper()
	h := newHelm(t, cfg, "helm4")
	dir := t.TempDir()
	pkg := filepath.Join(rel.Dir, "runwarden-"+rel.Chart.Version+".tgz")
	if out, err := exec.CommandContext(ctx, "tar", "-xzf", pkg, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", pkg, err, out)
	}
	chartYAML := filepath.Join(dir, "runwarden", "Chart.yaml")
	b, err := os.ReadFile(chartYAML)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "\nannotations:") {
		t.Fatalf("%s has annotations already; add the mark among them", chartYAML)
	}
	b = append(b, "\nannotations:\n  "+unsignedAnnotation+": pushed after signing\n"...)
	if err := os.WriteFile(chartYAML, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := h.run(ctx, "package", filepath.Join(dir, "runwarden"), "--version", rel.Chart.Version, "-d", dir); err != nil {
		t.Fatalf("packaging the unsigned chart: %v\n%s", err, out)
	}
	registry := strings.TrimSuffix(rel.Chart.Ref, "/runwarden")
	out, err := h.run(ctx, "push", filepath.Join(dir, "runwarden-"+rel.Chart.Version+".tgz"), registry, "--ca-file", rel.CAFile)
	if err != nil {
		t.Fatalf("pushing the unsigned chart: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^Digest: (sha256:[0-9a-f]{64})$`).FindStringSubmatch(out)
	if m == nil || m[1] == rel.Chart.Digest {
		t.Fatalf("helm push of the unsigned chart printed %q; want a digest other than the signed %s", out, rel.Chart.Digest)
	}
	t.Cleanup(func() { retag(t, rel) })
	// It is what an install by tag or --version gets now, and it verifies
	// against nothing.
	if _, err := suite.Cosign(ctx, rel, "verify", "--key", filepath.Join(rel.Dir, "cosign.pub"), "--insecure-ignore-tlog",
		strings.TrimPrefix(rel.Chart.Ref, "oci://")+"@"+m[1]); err == nil {
		t.Errorf("the chart pushed over the tag, %s, verifies against the release's key", m[1])
	}
	t.Logf("the tag %s:%s now names an unsigned chart, %s", rel.Chart.Ref, rel.Chart.Version, m[1])
	return m[1]
}

// retag points the chart's tag at the signed chart again.
func retag(t *testing.T, rel *harness.Release) {
	t.Helper()
	ca, err := os.ReadFile(rel.CAFile)
	if err != nil {
		t.Error(err)
		return
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	transport := remote.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	repo := strings.TrimPrefix(rel.Chart.Ref, "oci://")
	digest, err := name.NewDigest(repo + "@" + rel.Chart.Digest)
	if err != nil {
		t.Error(err)
		return
	}
	tag, err := name.NewTag(repo + ":" + rel.Chart.Version)
	if err != nil {
		t.Error(err)
		return
	}
	signed, err := remote.Get(digest, remote.WithTransport(transport))
	if err != nil {
		t.Errorf("reading the signed chart to tag it again: %v", err)
		return
	}
	if err := remote.Tag(tag, signed, remote.WithTransport(transport)); err != nil {
		t.Errorf("tagging the signed chart again: %v", err)
	}
}

// installedSigned checks that Helm's release holds the signed chart, not the
// unsigned one pushed under its tag.
func installedSigned(ctx context.Context, t *testing.T, h *helmRun, release, ns string, rel *harness.Release) {
	t.Helper()
	out, err := h.run(ctx, "get", "metadata", release, "-n", ns, "-o", "json")
	if err != nil {
		t.Errorf("helm get metadata %s: %v", release, err)
		return
	}
	var md struct {
		Version     string            `json:"version"`
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal([]byte(out), &md); err != nil {
		t.Errorf("helm get metadata %s printed %q: %v", release, out, err)
		return
	}
	if md.Version != rel.Chart.Version || md.Annotations[unsignedAnnotation] != "" {
		t.Errorf("release %s installed chart version %s with annotations %v: the chart pushed over the tag, not the signed %s",
			release, md.Version, md.Annotations, rel.ChartByDigest())
	}
}

// pulledImages returns what the node pulled for each container of p.
func pulledImages(p *corev1.Pod) []string {
	var ids []string
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, s := range statuses {
			if !slices.Contains(ids, s.ImageID) {
				ids = append(ids, s.ImageID)
			}
		}
	}
	return ids
}

// decodeAttestation returns the SBOM in the first in-toto statement that
// cosign verify-attestation printed (one DSSE envelope per line, its
// payload base64).
func decodeAttestation(t *testing.T, out string) string {
	t.Helper()
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	var env struct {
		Payload string `json:"payload"`
	}
	if err := json.Unmarshal([]byte(line), &env); err != nil {
		t.Fatalf("cosign verify-attestation printed %q: %v", line, err)
	}
	b, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// otherCosignKey makes a key pair that signed nothing and returns its public key.
func otherCosignKey(ctx context.Context, t *testing.T, rel *harness.Release) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := suite.Cosign(ctx, rel, "generate-key-pair", "--output-key-prefix", filepath.Join(dir, "other")); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "other.pub")
}

// sameDigestAgain builds one of the release's platform images again, from
// nothing (an empty image folder), as another builder would: umask 077 and
// Go's VCS stamping asked for in GOFLAGS (a checkout's git state is not an
// input). It checks the image has the digest the release pushed: the same
// commit gives the same image, whoever builds it.
func sameDigestAgain(ctx context.Context, t *testing.T, rel *harness.Release, image, arch string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "-c", `umask 077 && exec "$@"`, "umask",
		filepath.Join(suite.RepoRoot, "hack", "images.sh"), "release-archive", image, arch, rel.Version)
	cmd.Env = append(os.Environ(), "RUNWARDEN_IMAGES_DIR="+t.TempDir(), "GOFLAGS=-trimpath -buildvcs=true")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("building %s for %s again: %v\n%s", image, arch, err, stderr.String())
	}
	img, err := tarball.ImageFromPath(strings.TrimSpace(string(out)), nil)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if want := rel.Images[image].Platforms["linux/"+arch]; digest.String() != want {
		t.Errorf("%s for linux/%s built again: digest %s, the release pushed %s", image, arch, digest, want)
	}
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// realJob returns a Job whose one pod runs script in the runner image on
// the real node.
func realJob(ctx context.Context, t *testing.T, ns, name, script string) *batchv1.Job {
	t.Helper()
	image, err := suite.ImageRef(ctx, "runner")
	if err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job": name}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers: []corev1.Container{{
						Name:    "main",
						Image:   image,
						Command: []string{"/bin/sh", "-c", script},
					}},
				},
			},
		},
	}
	harness.OnRealNode(&job.Spec.Template.Spec)
	return job
}

// runToCompletion creates job, waits for it to complete and returns its
// pod's logs.
func runToCompletion(ctx context.Context, t *testing.T, cfg *envconf.Config, job *batchv1.Job) (corev1.Pod, string) {
	t.Helper()
	r := cfg.Client().Resources(job.Namespace)
	if err := r.Create(ctx, job); err != nil {
		t.Fatalf("creating job %s: %v", job.Name, err)
	}
	done := conditions.New(r).ResourceMatch(job, func(o k8s.Object) bool {
		for _, c := range o.(*batchv1.Job).Status.Conditions {
			if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if err := harness.WaitFor(ctx, "job "+job.Name+" to finish", 2*time.Minute, done); err != nil {
		t.Fatal(err)
	}
	pod := onlyPod(ctx, t, cfg, job)
	logs, err := harness.PodLogs(ctx, cfg, job.Namespace, pod.Name, "main")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			t.Fatalf("job %s failed (%s: %s); its logs:\n%s", job.Name, c.Reason, c.Message, logs)
		}
	}
	return pod, logs
}

func onlyPod(ctx context.Context, t *testing.T, cfg *envconf.Config, job *batchv1.Job) corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := cfg.Client().Resources(job.Namespace).List(ctx, &pods, func(o *metav1.ListOptions) {
		o.LabelSelector = "job=" + job.Name
	}); err != nil {
		t.Fatalf("listing pods of job %s: %v", job.Name, err)
	}
	if len(pods.Items) != 1 {
		t.Fatalf("job %s has %d pods, want 1", job.Name, len(pods.Items))
	}
	return pods.Items[0]
}

// TestRealNodeRunsContainers proves pods on the real node really execute:
// the output is the container's own, volumes are really mounted, the API
// server is reachable by ClusterIP and by name, a deadline really kills the
// process, and kubectl logs and exec reach the kubelet.
func TestRealNodeRunsContainers(t *testing.T) {
	t.Parallel()
	f := features.New("real node runs containers").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			return ctx
		}).
		Assess("output is the container's own", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			// The pod's hostname and a sum are only known inside the container.
			job := realJob(ctx, t, ns, "hello", `echo "hello from $(hostname), 6*7=$((6*7))"`)
			pod, logs := runToCompletion(ctx, t, cfg, job)
			want := fmt.Sprintf("hello from %s, 6*7=42\n", pod.Name)
			if logs != want {
				t.Errorf("logs = %q, want %q", logs, want)
			}
			if pod.Spec.NodeName != "rw-real-0" {
				t.Errorf("pod ran on %q, want the real node rw-real-0", pod.Spec.NodeName)
			}
			out, err := suite.Kubectl(ctx, cfg, "logs", "-n", ns, pod.Name, "-c", "main")
			if err != nil {
				t.Fatal(err)
			}
			if out != want {
				t.Errorf("kubectl logs = %q, want %q", out, want)
			}
			return ctx
		}).
		Assess("secret volume and projected token are mounted", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			secret := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: ns},
				StringData: map[string]string{"password": "s3cr3t-" + ns},
			}
			if err := r.Create(ctx, secret); err != nil {
				t.Fatalf("creating secret: %v", err)
			}
			job := realJob(ctx, t, ns, "mounts", `
cat /creds/password; echo
tok=$(cat /var/run/secrets/tokens/api)
echo "token-parts=$(echo "$tok" | tr '.' '\n' | wc -l)"
echo "sa-token=$(head -c 3 /var/run/secrets/kubernetes.io/serviceaccount/token)"`)
			spec := &job.Spec.Template.Spec
			spec.Volumes = []corev1.Volume{
				{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
				{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
						Audience: "runwarden-e2e", ExpirationSeconds: ptr.To[int64](3600), Path: "api",
					}}},
				}}},
			}
			spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
				{Name: "creds", MountPath: "/creds", ReadOnly: true},
				{Name: "token", MountPath: "/var/run/secrets/tokens", ReadOnly: true},
			}
			_, logs := runToCompletion(ctx, t, cfg, job)
			want := "s3cr3t-" + ns + "\ntoken-parts=3\nsa-token=eyJ\n"
			if logs != want {
				t.Errorf("logs = %q, want %q", logs, want)
			}
			return ctx
		}).
		Assess("API server reachable by ClusterIP and by name", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			// TLS to the API server is proven by the OpenTofu runner test; here
			// the cluster DNS answers and TCP reaches the API server both ways.
			ns := harness.Namespace(ctx)
			job := realJob(ctx, t, ns, "api", `
nslookup kubernetes.default.svc.cluster.local | grep -q "Address: $KUBERNETES_SERVICE_HOST" && echo "dns=ok"
nc -w 5 "$KUBERNETES_SERVICE_HOST" 443 </dev/null && echo "ip=ok"
nc -w 5 kubernetes.default.svc 443 </dev/null && echo "name=ok"
true`)
			_, logs := runToCompletion(ctx, t, cfg, job)
			if want := "dns=ok\nip=ok\nname=ok\n"; logs != want {
				t.Errorf("logs = %q, want %q", logs, want)
			}
			return ctx
		}).
		Assess("kubectl exec runs in the container", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			job := realJob(ctx, t, ns, "exec", `echo ready; sleep 120`)
			if err := r.Create(ctx, job); err != nil {
				t.Fatalf("creating job: %v", err)
			}
			running := conditions.New(r).ResourceListMatchN(&corev1.PodList{}, 1, func(o k8s.Object) bool {
				return o.(*corev1.Pod).Status.Phase == corev1.PodRunning
			}, func(o *metav1.ListOptions) { o.LabelSelector = "job=exec" })
			if err := harness.WaitFor(ctx, "pod of job exec to run", time.Minute, running); err != nil {
				t.Fatal(err)
			}
			pod := onlyPod(ctx, t, cfg, job)
			out, err := suite.Kubectl(ctx, cfg, "exec", "-n", ns, pod.Name, "-c", "main", "--", "sh", "-c", "echo exec-$((40+2)) from $(hostname)")
			if err != nil {
				t.Fatal(err)
			}
			if want := "exec-42 from " + pod.Name + "\n"; out != want {
				t.Errorf("kubectl exec = %q, want %q", out, want)
			}
			return ctx
		}).
		Assess("activeDeadlineSeconds kills the process", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			job := realJob(ctx, t, ns, "deadline", `echo started; sleep 300; echo not-killed`)
			job.Spec.ActiveDeadlineSeconds = ptr.To[int64](3)
			job.Spec.Template.Finalizers = []string{"runwarden.dev/e2e-hold"}
			if err := r.Create(ctx, job); err != nil {
				t.Fatalf("creating job: %v", err)
			}
			failed := conditions.New(r).JobConditionMatch(job, batchv1.JobFailed, corev1.ConditionTrue)
			if err := harness.WaitFor(ctx, "job deadline to fail", time.Minute, failed); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, job.Name, ns, job); err != nil {
				t.Fatal(err)
			}
			var reason string
			for _, c := range job.Status.Conditions {
				if c.Type == batchv1.JobFailed {
					reason = c.Reason
				}
			}
			if reason != batchv1.JobReasonDeadlineExceeded {
				t.Errorf("job failed with reason %q, want %q", reason, batchv1.JobReasonDeadlineExceeded)
			}
			// The Job controller deletes the pod at the deadline; a finalizer of
			// the test keeps the object, so the kubelet's report that it really
			// stopped the container can be read.
			var terminated *corev1.ContainerStateTerminated
			pods := &corev1.PodList{}
			killed := conditions.New(r).ResourceListMatchN(pods, 1, func(o k8s.Object) bool {
				p := o.(*corev1.Pod)
				for _, s := range p.Status.ContainerStatuses {
					if s.Name == "main" && s.State.Terminated != nil {
						terminated = s.State.Terminated
						return true
					}
				}
				return false
			}, func(o *metav1.ListOptions) { o.LabelSelector = "job=deadline" })
			err := harness.WaitFor(ctx, "container of job deadline to terminate", time.Minute, killed)
			pod := onlyPod(ctx, t, cfg, job)
			pod.Finalizers = nil
			if uerr := r.Update(ctx, &pod); uerr != nil {
				t.Errorf("removing the test's finalizer from pod %s: %v", pod.Name, uerr)
			}
			if err != nil {
				t.Fatal(err)
			}
			if terminated.ExitCode != 137 && terminated.ExitCode != 143 {
				t.Errorf("container exited %d (%s), want killed by SIGKILL (137) or SIGTERM (143)", terminated.ExitCode, terminated.Reason)
			}
			if d := terminated.FinishedAt.Sub(terminated.StartedAt.Time); d > 60*time.Second {
				t.Errorf("container ran %s, the deadline was 3s", d)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestRunwardenImagesStart runs the images of runwarden's own binaries on
// the real node: each starts, as the non-root user, and prints its version.
func TestRunwardenImagesStart(t *testing.T) {
	t.Parallel()
	f := features.New("runwarden images start").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			if suite.Kind != harness.ClusterLocal {
				t.Skip("skipped: images are loaded by hack/images.sh into the local cluster's node only")
			}
			if err := suite.LoadImages(ctx, "webhook", "postrender"); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("webhook and postrender print their versions", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			for _, image := range []string{"webhook", "postrender"} {
				ref, err := suite.ImageRef(ctx, image)
				if err != nil {
					t.Fatal(err)
				}
				job := realJob(ctx, t, ns, image, "")
				c := &job.Spec.Template.Spec.Containers[0]
				c.Image, c.Command, c.Args = ref, nil, []string{"--version"}
				c.SecurityContext = &corev1.SecurityContext{RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false)}
				_, logs := runToCompletion(ctx, t, cfg, job)
				tag := ref[strings.LastIndex(ref, ":")+1:]
				if want := "runwarden-" + image + " " + tag + "\n"; logs != want {
					t.Errorf("%s --version printed %q, want %q", image, logs, want)
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// tofuConfig is an OpenTofu configuration with one built-in resource and
// the kubernetes backend, which keeps state in a Secret and locks with a Lease.
const tofuConfig = `
terraform {
  backend "kubernetes" {
    secret_suffix = "runner"
  }
}

resource "terraform_data" "example" {
  input = "hello from runwarden"
}

output "value" {
  value = terraform_data.example.output
}
`

// TestRealRunnerAppliesOpenTofu runs a real runner: OpenTofu applies a
// configuration under a service account that may touch only secrets and
// leases in its namespace, its state lands in a Secret, and a second apply
// finds nothing to change. The first run reaches the API server through the
// kubernetes Service's ClusterIP (in-cluster config), the second by the name
// kubernetes.default.svc with the service account's CA, so both routes and
// the server certificate are proven.
func TestRealRunnerAppliesOpenTofu(t *testing.T) {
	t.Parallel()
	f := features.New("real runner applies OpenTofu").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			objs := []k8s.Object{
				&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: ns}},
				rbacRole{ns: ns}.role(),
				rbacRole{ns: ns}.binding(),
				&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tofu", Namespace: ns}, Data: map[string]string{"main.tf": tofuConfig}},
			}
			for _, o := range objs {
				if err := r.Create(ctx, o); err != nil {
					t.Fatalf("creating %T: %v", o, err)
				}
			}
			return ctx
		}).
		Assess("apply succeeds and state is in a Secret", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			_, logs := runToCompletion(ctx, t, cfg, tofuJob(ctx, t, ns, "apply-1", false))
			if !strings.Contains(logs, "Apply complete! Resources: 1 added, 0 changed, 0 destroyed.") {
				t.Errorf("first apply did not add the resource; logs:\n%s", logs)
			}
			r := cfg.Client().Resources(ns)
			var secret corev1.Secret
			if err := r.Get(ctx, "tfstate-default-runner", ns, &secret); err != nil {
				t.Errorf("state secret: %v", err)
			} else if len(secret.Data["tfstate"]) == 0 {
				t.Errorf("state secret has no tfstate data: keys %v", keys(secret.Data))
			}
			if err := harness.WaitFor(ctx, "the state lock lease", 10*time.Second, leaseExists(cfg, ns, "lock-tfstate-default-runner")); err != nil {
				t.Error(err)
			}
			return ctx
		}).
		Assess("second apply changes nothing", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			_, logs := runToCompletion(ctx, t, cfg, tofuJob(ctx, t, ns, "apply-2", true))
			if !strings.Contains(logs, "No changes.") || !strings.Contains(logs, "Apply complete! Resources: 0 added, 0 changed, 0 destroyed.") {
				t.Errorf("second apply was not a no-op; logs:\n%s", logs)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

func tofuJob(ctx context.Context, t *testing.T, ns, name string, byName bool) *batchv1.Job {
	t.Helper()
	backend := `export KUBE_IN_CLUSTER_CONFIG=true`
	if byName {
		backend = `sa=/var/run/secrets/kubernetes.io/serviceaccount
export KUBE_HOST=https://kubernetes.default.svc KUBE_TOKEN="$(cat $sa/token)" KUBE_CLUSTER_CA_CERT_DATA="$(cat $sa/ca.crt)"`
	}
	job := realJob(ctx, t, ns, name, `
set -e
`+backend+`
cp /config/main.tf /work/
cd /work
tofu init -input=false -no-color
tofu apply -auto-approve -input=false -no-color`)
	spec := &job.Spec.Template.Spec
	spec.ServiceAccountName = "runner"
	spec.Containers[0].Env = []corev1.EnvVar{
		{Name: "KUBE_NAMESPACE", Value: ns},
		{Name: "TF_IN_AUTOMATION", Value: "1"},
	}
	spec.Volumes = []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "tofu"},
		}}},
		{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: "config", MountPath: "/config", ReadOnly: true},
		{Name: "work", MountPath: "/work"},
	}
	spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr.To[int64](65532)}
	return job
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

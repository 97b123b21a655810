package harness

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
)

// The real node of the local cluster (hack/node.sh): its label, and the
// taint a pod must tolerate to land there.
const (
	RealNodeLabel    = "runwarden.dev/node"
	RealNodeValue    = "real"
	RealNodeTaintKey = "runwarden.dev/real-node"
)

// RequireRealNode skips the test, saying why, when the cluster has no real
// node (a cluster started with RUNWARDEN_REAL_NODE=false, or one that is not
// the local cluster).
func RequireRealNode(ctx context.Context, t *testing.T, cfg *envconf.Config) {
	t.Helper()
	var nodes corev1.NodeList
	err := cfg.Client().Resources().List(ctx, &nodes, func(o *metav1.ListOptions) {
		o.LabelSelector = RealNodeLabel + "=" + RealNodeValue
	})
	if err != nil {
		t.Fatalf("listing nodes: %v", err)
	}
	if len(nodes.Items) == 0 {
		t.Skipf("skipped: no node labelled %s=%s; these tests need the local cluster's real node (hack/node.sh)",
			RealNodeLabel, RealNodeValue)
	}
}

// OnRealNode places a pod spec on the real node: it selects the node and
// tolerates its taint, and never pulls (the node has no registry).
func OnRealNode(spec *corev1.PodSpec) {
	if spec.NodeSelector == nil {
		spec.NodeSelector = map[string]string{}
	}
	spec.NodeSelector[RealNodeLabel] = RealNodeValue
	spec.Tolerations = append(spec.Tolerations, corev1.Toleration{
		Key: RealNodeTaintKey, Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule,
	})
	for i := range spec.InitContainers {
		spec.InitContainers[i].ImagePullPolicy = corev1.PullNever
	}
	for i := range spec.Containers {
		spec.Containers[i].ImagePullPolicy = corev1.PullNever
	}
}

// ImageRef returns the reference of one of runwarden's locally built images
// (hack/images.sh), e.g. "runner".
func (c Config) ImageRef(ctx context.Context, image string) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "images.sh"), "ref", image).Output()
	if err != nil {
		return "", fmt.Errorf("hack/images.sh ref %s: %w", image, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Kubectl runs the pinned kubectl (or kubectl from PATH when the pinned one
// is not built) against the suite's cluster and returns its stdout.
func (c Config) Kubectl(ctx context.Context, cfg *envconf.Config, args ...string) (string, error) {
	bin := "kubectl"
	if out, err := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "tools.sh"), "path", "kubernetes").Output(); err == nil {
		pinned := filepath.Join(strings.TrimSpace(string(out)), "kubectl")
		if _, err := exec.LookPath(pinned); err == nil {
			bin = pinned
		}
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", cfg.KubeconfigFile()}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// PodLogs returns the logs of a pod's container through the API server.
func PodLogs(ctx context.Context, cfg *envconf.Config, namespace, pod, container string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg.Client().RESTConfig())
	if err != nil {
		return "", fmt.Errorf("making a clientset: %w", err)
	}
	b, err := cs.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container}).Do(ctx).Raw()
	if err != nil {
		return "", fmt.Errorf("logs of %s/%s: %w", namespace, pod, err)
	}
	return string(b), nil
}

// LoadImages builds runwarden images and loads them into the real node's
// containerd (hack/images.sh), for the local cluster.
func (c Config) LoadImages(ctx context.Context, images ...string) error {
	sock, err := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "node.sh"), "socket", "--name", c.Name).Output()
	if err != nil {
		return fmt.Errorf("finding the real node's containerd: %w", err)
	}
	args := append([]string{"load"}, images...)
	args = append(args, "--address", strings.TrimSpace(string(sock)))
	cmd := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "images.sh"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hack/images.sh %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return nil
}

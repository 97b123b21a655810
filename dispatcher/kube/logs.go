package kube

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
)

// LogReader reads the end of a container's log.
type LogReader interface {
	// Tail returns at most limit bytes, the last of the log's last lines.
	Tail(ctx context.Context, namespace, pod, container string, limit int) ([]byte, error)
}

// maxTailLines bounds how much of a log the API server sends for a tail.
const maxTailLines = 10000

// APILogTail reads logs through the API server (pods/log).
type APILogTail struct {
	Client corev1client.PodsGetter
}

var _ LogReader = APILogTail{}

// Tail implements LogReader: the log's last maxTailLines lines, of which
// the last limit bytes are kept as they stream, so memory stays bounded.
func (k APILogTail) Tail(ctx context.Context, namespace, pod, container string, limit int) ([]byte, error) {
	rc, err := k.Client.Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: ptr.To[int64](maxTailLines)}).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	return lastBytes(bufio.NewReader(rc), limit)
}

// lastBytes reads r to its end and returns its last limit bytes.
func lastBytes(r io.Reader, limit int) ([]byte, error) {
	buf := make([]byte, 0, 2*limit)
	chunk := make([]byte, 32*1024)
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if len(buf) > 2*limit {
			buf = append(buf[:0], buf[len(buf)-limit:]...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(buf) > limit {
		buf = buf[len(buf)-limit:]
	}
	return buf, nil
}

// LogConfigMapName is the ConfigMap that keeps the log of a task's Job.
func LogConfigMapName(jobName string) string { return jobName + "-log" }

// keepLog copies the end of the runner container's log of a finished
// task's pod into a ConfigMap owned by the RunnerTask (it goes with the
// task, not with the Job), and returns its name. A pod that is gone, or a
// log that cannot be read, keeps nothing.
func (r *Reconciler) keepLog(ctx context.Context, rt *v1alpha1.RunnerTask, jobName, pod string) (string, error) {
	if r.opts.Logs == nil || r.opts.KeepLogBytes <= 0 || pod == "" {
		return "", nil
	}
	tail, err := r.opts.Logs.Tail(ctx, rt.Namespace, pod, job.RunnerContainer, r.opts.KeepLogBytes)
	if err != nil {
		return "", nil //nolint:nilerr // a log that cannot be read is not kept; the task's outcome is.
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: LogConfigMapName(jobName), Namespace: rt.Namespace,
		Labels:      map[string]string{job.LabelDispatcher: r.opts.Jobs.DispatcherID},
		Annotations: map[string]string{job.AnnotationTaskID: TaskID(rt)},
	}}
	// A log is text, but a container may write anything.
	if utf8.Valid(tail) {
		cm.Data = map[string]string{"log": string(tail)}
	} else {
		cm.BinaryData = map[string][]byte{"log": tail}
	}
	if err := controllerutil.SetControllerReference(rt, cm, r.opts.Client.Scheme()); err != nil {
		return "", err
	}
	if err := r.opts.Client.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("keeping the log of job %s: %w", jobName, err)
	}
	return cm.Name, nil
}

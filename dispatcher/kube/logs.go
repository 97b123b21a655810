package kube

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/contract"
)

// LogConfigMapPrefix is how the name of a ConfigMap that keeps the log of a
// task's Job begins; the API server draws the rest (generateName).
func LogConfigMapPrefix(jobName string) string { return jobName + "-log-" }

// keepLog copies the end of the runner container's log of a finished
// task's pod into a ConfigMap owned by the RunnerTask (it goes with the
// task, not with the Job), and returns its name. A pod that is gone, or a
// log that cannot be read, keeps nothing.
//
// The name is drawn by the API server, and only the ConfigMap this
// dispatcher's create made is ever returned: one of a name known ahead
// (the Job's name is in the namespace while it runs, the task's UID in
// its owner references) could have been made by whoever may create
// ConfigMaps there, with any owner, labels and data, and the dispatcher
// may not read it back (create only). A drawn name someone holds fails
// the create (AlreadyExists): the try fails, naming nothing, and the
// next one draws another. A try that made its ConfigMap but could not
// record it in the status leaves it for the next try of this process to
// name (r.kept); after a restart in between, it stays unnamed until the
// RunnerTask, its owner, goes.
func (r *Reconciler) keepLog(ctx context.Context, rt *v1alpha1.RunnerTask, jobName, pod string) (string, error) {
	if r.opts.Logs == nil || r.opts.KeepLogBytes <= 0 || pod == "" {
		return "", nil
	}
	if name := r.keptLog(rt); name != "" {
		return name, nil
	}
	tail, err := r.tail(ctx, rt.Namespace, pod)
	if err != nil {
		return "", nil //nolint:nilerr // a log that cannot be read is not kept; the task's outcome is.
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		GenerateName: LogConfigMapPrefix(jobName), Namespace: rt.Namespace,
		Labels:      map[string]string{contract.LabelDispatcher: r.opts.Jobs.DispatcherID},
		Annotations: map[string]string{contract.TaskID: TaskID(rt)},
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
	if err := r.opts.Client.Create(ctx, cm); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("keeping the log of job %s: a ConfigMap holds the name drawn for it, and is not taken for the task's log; the next try draws another: %w", jobName, err)
		}
		return "", fmt.Errorf("keeping the log of job %s: %w", jobName, err)
	}
	r.keptMu.Lock()
	r.kept[client.ObjectKeyFromObject(rt)] = logMade{uid: rt.UID, name: cm.Name}
	r.keptMu.Unlock()
	return cm.Name, nil
}

// emptyLogReads is how many times tail reads a log that comes back empty,
// logReadGap apart, before it takes it for empty: the kubelet may report a
// container's exit before the last of its output has reached the log file
// (seen on a loaded node: a runner that printed a line and exited at once
// was kept with an empty log). A runner that prints nothing costs its task
// less than a second more.
const (
	emptyLogReads = 4
	logReadGap    = 250 * time.Millisecond
)

// tail reads the end of a finished pod's runner log (KeepLogBytes), reading
// again while it comes back empty (emptyLogReads).
func (r *Reconciler) tail(ctx context.Context, namespace, pod string) ([]byte, error) {
	for read := 1; ; read++ {
		tail, err := r.opts.Logs.Tail(ctx, namespace, pod, job.RunnerContainer, r.opts.KeepLogBytes)
		if err != nil || len(tail) > 0 || read == emptyLogReads {
			return tail, err
		}
		select {
		case <-ctx.Done():
			return tail, nil
		case <-r.opts.Clock.After(logReadGap):
		}
	}
}

// logMade is the log ConfigMap a RunnerTask's earlier try made, if its
// status does not name it yet.
type logMade struct {
	uid  types.UID
	name string
}

// keptLog returns the name of the log ConfigMap this process made for rt
// (this RunnerTask, not an earlier one of its name), or "".
func (r *Reconciler) keptLog(rt *v1alpha1.RunnerTask) string {
	r.keptMu.Lock()
	defer r.keptMu.Unlock()
	if k := r.kept[client.ObjectKeyFromObject(rt)]; k.uid == rt.UID {
		return k.name
	}
	return ""
}

// forgetKept drops what keptLog remembers of a task: its status names its
// log, or it is gone.
func (r *Reconciler) forgetKept(task types.NamespacedName) {
	r.keptMu.Lock()
	delete(r.kept, task)
	r.keptMu.Unlock()
}

package orchestrator

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/contract"
)

// The log streamed as a task's is its Job's own pod's: a pod planted with
// the Job's job-name label, scheduled and listed first, is never opened,
// and a pod of the streamed pod's name that is not the Job's reads as gone
// (job.IsPodOf).
func TestLogsAreTheJobsOwnPods(t *testing.T) {
	t.Parallel()
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "rw-t-1", Namespace: "runners", UID: "job-uid-1",
		Labels: map[string]string{contract.TaskID: "t-1", contract.LabelDispatcher: "d1"}}}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: j.Namespace,
				Labels:          map[string]string{batchv1.JobNameLabel: j.Name, contract.LabelRunner: "true", contract.TaskID: "t-1"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: "node-1"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
				Name: job.RunnerContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			}}},
		}
	}
	for _, c := range []struct {
		name  string
		plant func(p *corev1.Pod)
	}{
		{"the job-name label alone", func(p *corev1.Pod) {
			p.Labels, p.OwnerReferences = map[string]string{batchv1.JobNameLabel: j.Name}, nil
		}},
		{"a forged owner reference with another UID", func(p *corev1.Pod) { p.OwnerReferences[0].UID = "forged" }},
		{"no runner label", func(p *corev1.Pod) { delete(p.Labels, contract.LabelRunner) }},
		{"another task's label", func(p *corev1.Pod) { p.Labels[contract.TaskID] = "t-2" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Named to be listed before the Job's own.
			planted := pod("a-planted")
			c.plant(planted)
			alone := New(Options{Kube: fake.NewClientBuilder().WithObjects(planted.DeepCopy()).Build()})
			if got := alone.runnerPod(t.Context(), j); got != "" {
				t.Errorf("with the planted pod alone, the log is read from %q, want none", got)
			}
			own := pod("rw-t-1-abcde")
			s := New(Options{Kube: fake.NewClientBuilder().WithObjects(planted, own).Build()})
			if got := s.runnerPod(t.Context(), j); got != own.Name {
				t.Errorf("the log is read from %q, want the Job's own pod %s", got, own.Name)
			}
			if !s.containerDone(t.Context(), j, planted.Name) {
				t.Error("the planted pod, running, reads as the Job's running pod")
			}
			if s.containerDone(t.Context(), j, own.Name) {
				t.Error("the Job's own running pod reads as done")
			}
		})
	}
}

// cutLog is a runner log whose first follow ends before its last bytes
// (as the kubelet's can at the container's exit, while the runtime still
// writes the container's last output), and whose later reads give it all.
type cutLog struct {
	mu    sync.Mutex
	log   string
	cut   int
	reads int
}

func (c *cutLog) Follow(context.Context, string, string, string) (io.ReadCloser, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	if c.reads == 1 {
		return io.NopCloser(strings.NewReader(c.log[:c.cut])), nil
	}
	return io.NopCloser(strings.NewReader(c.log)), nil
}

func (c *cutLog) Tail(context.Context, string, string, string, int) ([]byte, error) {
	return []byte(c.log), nil
}

// The streamed log reaches the orchestrator whole when the follow ended
// before the container's last output: once the container has ended, the
// log is read once more past what was sent, and only then is the log
// final.
func TestLogsEndWithTheContainersLastOutput(t *testing.T) {
	t.Parallel()
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "rw-t-1", Namespace: "runners", UID: "job-uid-1",
		Labels: map[string]string{contract.TaskID: "t-1", contract.LabelDispatcher: "d1"}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "rw-t-1-abcde", Namespace: j.Namespace,
			Labels:          map[string]string{batchv1.JobNameLabel: j.Name, contract.LabelRunner: "true", contract.TaskID: "t-1"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
			Name: job.RunnerContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}},
		}}},
	}
	var mu sync.Mutex
	var chunks []LogChunk
	c, err := NewClient(ClientOptions{URL: "https://orch.example", DispatcherID: "d-1", Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path == PathLogs("t-1") {
			var ch LogChunk
			if err := json.NewDecoder(r.Body).Decode(&ch); err != nil {
				t.Error(err)
			}
			mu.Lock()
			chunks = append(chunks, ch)
			mu.Unlock()
		}
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	full := strings.Repeat("a line of the runner's output\n", 100) + "the last line"
	logs := &cutLog{log: full, cut: len(full) - 20}
	s := New(Options{Client: c, Kube: fake.NewClientBuilder().WithObjects(pod).Build(), Logs: logs, Namespace: "runners", Jobs: job.Options{DispatcherID: "d-1"}})
	tk, _, _, _ := s.leases.take(Lease{LeaseID: "l-1", Epoch: 1, LeaseSeconds: 60, Task: Task{ID: "t-1"}}, time.Now(), time.Minute, true)
	if tk == nil {
		t.Fatal("the lease was not taken")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s.runLogs(ctx, tk, &logStream{stopped: make(chan struct{}), done: make(chan struct{})}, j)
	mu.Lock()
	defer mu.Unlock()
	var got strings.Builder
	for i, ch := range chunks {
		if ch.Offset != int64(got.Len()) {
			t.Errorf("chunk %d at offset %d, after %d bytes", i, ch.Offset, got.Len())
		}
		got.Write(ch.Data)
	}
	if got.String() != full || len(chunks) == 0 || !chunks[len(chunks)-1].Final {
		t.Errorf("the orchestrator got %d bytes in %d chunks (last final: %v), want the %d of the log, then final", got.Len(), len(chunks), len(chunks) > 0 && chunks[len(chunks)-1].Final, len(full))
	}
}

package runner

import (
	"bufio"
	"context"
	"io"

	corev1 "k8s.io/api/core/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"
)

// maxTailLines bounds how much of a log the API server sends for a tail.
const maxTailLines = 10000

// PodLogs reads logs through the API server (pods/log).
type PodLogs struct {
	Client corev1client.PodsGetter
}

var _ LogReader = PodLogs{}

// Follow implements LogReader.
func (p PodLogs) Follow(ctx context.Context, namespace, pod, container string) (io.ReadCloser, error) {
	return p.Client.Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true}).Stream(ctx)
}

// Tail implements LogReader: the log's last maxTailLines lines, of which
// the last limit bytes are kept as they stream, so memory stays bounded.
func (p PodLogs) Tail(ctx context.Context, namespace, pod, container string, limit int) ([]byte, error) {
	rc, err := p.Client.Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: ptr.To[int64](maxTailLines)}).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	return lastBytes(bufio.NewReader(rc), limit)
}

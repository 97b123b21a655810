package runner

import (
	"context"
	"io"
)

// LogReader reads a runner container's log: the orchestrator source
// follows it to stream it; the kube source keeps its end.
type LogReader interface {
	// Follow opens the log, following it until the container ends.
	Follow(ctx context.Context, namespace, pod, container string) (io.ReadCloser, error)
	// Tail returns at most limit bytes: the end of the log's last lines.
	Tail(ctx context.Context, namespace, pod, container string, limit int) ([]byte, error)
}

// lastBytes reads r to its end and returns its last limit bytes, holding
// no more than twice that.
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

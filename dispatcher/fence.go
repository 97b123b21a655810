package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fencedLock is leader election's Lease lock, made as controller-runtime
// makes it, that remembers when the last write of the Lease that landed
// (taking or renewing it) was sent.
//
// A leader that cannot renew keeps dispatching, as leader election goes,
// until its renew deadline has passed after the retry period that follows
// its last renewal, then tries to release the Lease (one more request,
// which a partition holds up to half the renew deadline) before it stops: up
// to 17 s after the last renewal with the defaults, while a standby may
// take over 15 s after it saw that renewal. The fence closes sooner: writes
// through fencedClient stop a renew deadline after the last renewal was
// sent, which the standby saw no earlier.
//
// Closing the fence to new writes is not enough: a write let through just
// before it closes could wait (in the client's rate limiter, on a stalled
// connection) and land after a standby leads, since the manager's client
// has no timeout of its own. So each write fencedClient lets through
// carries a deadline at the fence's close: it is answered before the
// fence closes or fails (errFenceClosed). With renewal R sent at S, every
// write this replica waits on and acts on is answered before S + renew
// deadline, a lease duration less a renew deadline (5 s with the defaults)
// before any standby may lead (S + lease duration at the earliest). What
// the deadline cannot bound is a request the network holds after the
// dispatcher gave up on it and delivers later: whether the API server then
// applies it is the server's, as for any client. The deadline is per write,
// not rest.Config.Timeout, which would also end the cache's watches.
type fencedLock struct {
	resourcelock.Interface
	now  func() time.Time
	mu   sync.Mutex
	sent time.Time
}

func newFencedLock(cfg *rest.Config, namespace, name string, renewDeadline time.Duration) (*fencedLock, error) {
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	// As controller-runtime does: one hung request does not use up the
	// renew deadline.
	cfg.Timeout = max(renewDeadline/2, time.Second)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	id := host + "_" + string(uuid.NewUUID())
	events := record.NewBroadcaster()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events(namespace)})
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, namespace, name, cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{
		Identity:      id,
		EventRecorder: events.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "runwarden-dispatcher", Host: host}),
	})
	if err != nil {
		return nil, fmt.Errorf("making the leader election lock: %w", err)
	}
	return &fencedLock{Interface: lock, now: time.Now}, nil
}

func (l *fencedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	sent := l.now()
	err := l.Interface.Create(ctx, ler)
	l.landed(sent, ler, err)
	return err
}

func (l *fencedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	sent := l.now()
	err := l.Interface.Update(ctx, ler)
	l.landed(sent, ler, err)
	return err
}

// landed records a write of the Lease that this replica holds; a release
// (no holder) closes the fence.
func (l *fencedLock) landed(sent time.Time, ler resourcelock.LeaderElectionRecord, err error) {
	if err != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ler.HolderIdentity != l.Identity() {
		l.sent = time.Time{}
		return
	}
	l.sent = sent
}

// renewedWithin tells whether the last renewal that landed was sent less
// than d ago.
func (l *fencedLock) renewedWithin(d time.Duration) bool { return l.left(d) > 0 }

// left returns how long the fence stays open with renew deadline d: d after
// the send of the last renewal that landed, less the time since; zero or
// less once it is closed.
func (l *fencedLock) left(d time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent.IsZero() {
		return 0
	}
	return d - l.now().Sub(l.sent)
}

// errNotLeading is a write refused by fencedClient.
var errNotLeading = errors.New("not leading: this replica's last renewal of the Lease is older than the renew deadline")

// errFenceClosed is a write fencedClient let through that was not answered
// before the fence closed; it may not have landed, and is not retried.
var errFenceClosed = fmt.Errorf("%w (the fence closed before the write was answered)", errNotLeading)

// fencedClient refuses the sources' writes of objects (Jobs, Secrets, a
// RunnerTask's finalizer) unless left says this replica still leads for
// sure, and gives each write it lets through a deadline at the fence's
// close (fencedLock has the timing). Status writes are not fenced: they
// record what was observed.
type fencedClient struct {
	client.Client
	// left is how long the fence stays open (fencedLock.left).
	left func() time.Duration
}

// write runs one write if the fence is open, with a deadline at its close.
func (c fencedClient) write(ctx context.Context, do func(context.Context) error) error {
	left := c.left()
	if left <= 0 {
		return errNotLeading
	}
	fenced, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	err := do(fenced)
	if err != nil && fenced.Err() != nil && ctx.Err() == nil {
		// The fence's deadline, not the caller's, ended the write.
		return fmt.Errorf("%w: %w", errFenceClosed, err)
	}
	return err
}

func (c fencedClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.write(ctx, func(ctx context.Context) error { return c.Client.Create(ctx, obj, opts...) })
}

func (c fencedClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.write(ctx, func(ctx context.Context) error { return c.Client.Update(ctx, obj, opts...) })
}

func (c fencedClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.write(ctx, func(ctx context.Context) error { return c.Client.Patch(ctx, obj, patch, opts...) })
}

func (c fencedClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.write(ctx, func(ctx context.Context) error { return c.Client.Delete(ctx, obj, opts...) })
}

func (c fencedClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	return c.write(ctx, func(ctx context.Context) error { return c.Client.DeleteAllOf(ctx, obj, opts...) })
}

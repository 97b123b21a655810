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
func (l *fencedLock) renewedWithin(d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.sent.IsZero() && l.now().Sub(l.sent) < d
}

// errNotLeading is a write refused by fencedClient.
var errNotLeading = errors.New("not leading: this replica's last renewal of the Lease is older than the renew deadline")

// fencedClient refuses the sources' writes of objects (Jobs, Secrets, a
// RunnerTask's finalizer) unless open says this replica still leads for
// sure. Status writes are not fenced: they record what was observed.
type fencedClient struct {
	client.Client
	open func() bool
}

func (c fencedClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if !c.open() {
		return errNotLeading
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c fencedClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if !c.open() {
		return errNotLeading
	}
	return c.Client.Update(ctx, obj, opts...)
}

func (c fencedClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if !c.open() {
		return errNotLeading
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c fencedClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if !c.open() {
		return errNotLeading
	}
	return c.Client.Delete(ctx, obj, opts...)
}

func (c fencedClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	if !c.open() {
		return errNotLeading
	}
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

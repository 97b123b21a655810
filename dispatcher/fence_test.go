package main

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// stubLock is a resourcelock.Interface whose writes fail while failing is
// set.
type stubLock struct {
	resourcelock.Interface
	failing bool
}

func (l *stubLock) Identity() string { return "me" }

func (l *stubLock) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	return l.err()
}

func (l *stubLock) Update(context.Context, resourcelock.LeaderElectionRecord) error {
	return l.err()
}

func (l *stubLock) err() error {
	if l.failing {
		return errors.New("unreachable")
	}
	return nil
}

// The fence is open for a renew deadline after the send of the last write
// of the Lease that landed; a failed renewal does not reopen it, a release
// closes it, and writes through fencedClient fail once it is closed.
func TestFenceClosesARenewDeadlineAfterTheLastRenewalSent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stub := &stubLock{}
	lock := &fencedLock{Interface: stub, now: func() time.Time { return now }}
	mine := resourcelock.LeaderElectionRecord{HolderIdentity: "me"}
	ctx := t.Context()
	const deadline = 10 * time.Second
	if lock.renewedWithin(deadline) {
		t.Fatal("open before the Lease was ever taken")
	}
	if err := lock.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	kc := fencedClient{Client: fake.NewClientBuilder().Build(), open: func() bool { return lock.renewedWithin(deadline) }}
	cm := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	}
	if err := kc.Create(ctx, cm("taken")); err != nil {
		t.Errorf("a write right after the Lease was taken: %v", err)
	}
	now = now.Add(9 * time.Second)
	stub.failing = true
	_ = lock.Update(ctx, mine) // a renewal that does not land
	if !lock.renewedWithin(deadline) {
		t.Error("closed 9s after the last renewal, with a 10s renew deadline")
	}
	now = now.Add(time.Second)
	if lock.renewedWithin(deadline) {
		t.Error("open 10s after the last renewal")
	}
	if err := kc.Create(ctx, cm("late")); !errors.Is(err, errNotLeading) {
		t.Errorf("a write 10s after the last renewal: %v, want refused", err)
	}
	if err := kc.Delete(ctx, cm("taken")); !errors.Is(err, errNotLeading) {
		t.Errorf("a delete 10s after the last renewal: %v, want refused", err)
	}
	stub.failing = false
	if err := lock.Update(ctx, mine); err != nil || !lock.renewedWithin(deadline) {
		t.Errorf("a renewal that lands: %v, open %v", err, lock.renewedWithin(deadline))
	}
	if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil || lock.renewedWithin(deadline) {
		t.Errorf("after a release: %v, open %v; want closed", err, lock.renewedWithin(deadline))
	}
}

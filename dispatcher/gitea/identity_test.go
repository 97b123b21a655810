package gitea

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func TestLoadIdentity(t *testing.T) {
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "rw", Name: "runwarden-gitea-runner"}
	registered := 0
	register := func(context.Context) (Identity, error) {
		registered++
		return Identity{ID: int64(registered), UUID: "uuid-" + string(rune('0'+registered)), Token: "tok", Name: "runwarden"}, nil
	}
	c := fake.NewClientBuilder().Build()
	first, err := LoadIdentity(ctx, c, c, key, register)
	if err != nil || first.UUID != "uuid-1" || first.ID != 1 {
		t.Fatalf("first = %+v, %v", first, err)
	}
	again, err := LoadIdentity(ctx, c, c, key, register)
	if err != nil || again != first || registered != 1 {
		t.Errorf("a restart = %+v, %v after %d registrations; want the kept identity, one registration", again, err, registered)
	}

	// Two replicas at once: the one whose create loses takes the winner's.
	winner := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Data: map[string][]byte{"uuid": []byte("winner"), "token": []byte("wt"), "id": []byte("9")}}
	gets := 0
	raced := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			gets++
			if gets == 1 {
				// Not there yet when this replica looked; the other then
				// creates it.
				if err := c.Get(ctx, k, o, opts...); err == nil {
					return errors.New("unexpected")
				}
				if err := c.Create(ctx, winner.DeepCopy()); err != nil {
					return err
				}
				return c.Get(ctx, types.NamespacedName{Namespace: "none", Name: "none"}, o)
			}
			return c.Get(ctx, k, o, opts...)
		},
	}).Build()
	got, err := LoadIdentity(ctx, raced, raced, key, register)
	if err != nil || got.UUID != "winner" || got.ID != 9 {
		t.Errorf("after a lost race = %+v, %v; want the winner's identity", got, err)
	}

	// A damaged Secret is refused, saying how to recover.
	bad := fake.NewClientBuilder().WithObjects(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: map[string][]byte{"uuid": []byte("u")}}).Build()
	if _, err := LoadIdentity(ctx, bad, bad, key, register); err == nil || !strings.Contains(err.Error(), "delete it to register again") {
		t.Errorf("a Secret without a token: %v", err)
	}
	// A failed registration keeps nothing.
	empty := fake.NewClientBuilder().Build()
	if _, err := LoadIdentity(ctx, empty, empty, key, func(context.Context) (Identity, error) { return Identity{}, errors.New("refused") }); err == nil {
		t.Error("a failed registration returned an identity")
	}
	var s corev1.Secret
	if err := empty.Get(ctx, key, &s); err == nil {
		t.Error("a failed registration kept a Secret")
	}
}

package gitea

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the identity Secret.
const (
	identityUUID  = "uuid"
	identityToken = "token"
	identityID    = "id"
	identityName  = "name"
)

// LoadIdentity returns the runner identity kept in the Secret key, and
// registers one (register) and keeps it when there is none: every replica
// and every restart is then the same runner at Gitea. The Secret is only
// ever created, never replaced: of two replicas registering at once, the
// one whose create loses takes the winner's identity (its own runner stays
// registered at Gitea, unused, and shows offline there).
func LoadIdentity(ctx context.Context, r client.Reader, c client.Writer, key types.NamespacedName, register func(context.Context) (Identity, error)) (Identity, error) {
	var s corev1.Secret
	err := r.Get(ctx, key, &s)
	switch {
	case err == nil:
		return identityOf(&s)
	case !apierrors.IsNotFound(err):
		return Identity{}, fmt.Errorf("reading the runner identity %s: %w", key, err)
	}
	id, err := register(ctx)
	if err != nil {
		return Identity{}, err
	}
	s = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			identityUUID: []byte(id.UUID), identityToken: []byte(id.Token),
			identityID: []byte(strconv.FormatInt(id.ID, 10)), identityName: []byte(id.Name),
		},
	}
	err = c.Create(ctx, &s)
	if apierrors.IsAlreadyExists(err) {
		var won corev1.Secret
		if err := r.Get(ctx, key, &won); err != nil {
			return Identity{}, fmt.Errorf("reading the runner identity %s: %w", key, err)
		}
		return identityOf(&won)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("keeping the runner identity in %s (the runner %q is registered at Gitea but not kept: remove it there): %w", key, id.Name, err)
	}
	return id, nil
}

func identityOf(s *corev1.Secret) (Identity, error) {
	id := Identity{UUID: string(s.Data[identityUUID]), Token: string(s.Data[identityToken]), Name: string(s.Data[identityName])}
	if id.UUID == "" || id.Token == "" {
		return Identity{}, fmt.Errorf("the runner identity %s/%s has no %s or %s; delete it to register again", s.Namespace, s.Name, identityUUID, identityToken)
	}
	if v := string(s.Data[identityID]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Identity{}, fmt.Errorf("the runner identity %s/%s: id %q: %w", s.Namespace, s.Name, v, err)
		}
		id.ID = n
	}
	return id, nil
}

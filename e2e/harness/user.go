package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
)

// User is an unprivileged identity a test acts as: the suite's own
// credentials impersonate it, so the API server authorizes (and admission
// webhooks see) exactly that user, with only the RBAC the test grants.
type User struct {
	// Name is the user name, e.g. "alice" or
	// "system:serviceaccount:team-a:intruder".
	Name string
	// Groups the user is in; the API server adds system:authenticated.
	Groups []string
}

// Client returns a controller-runtime client that acts as u.
func (u User) Client(cfg *envconf.Config) (client.Client, error) {
	rc := rest.CopyConfig(cfg.Client().RESTConfig())
	rc.Impersonate = rest.ImpersonationConfig{UserName: u.Name, Groups: append([]string{"system:authenticated"}, u.Groups...)}
	c, err := client.New(rc, client.Options{Scheme: cfg.Client().Resources().GetScheme()})
	if err != nil {
		return nil, fmt.Errorf("client for user %s: %w", u.Name, err)
	}
	return c, nil
}

// Grant gives u the rules in namespace ns, as a Role and RoleBinding named
// name, and waits until the API server's authorizer, which reads RBAC from
// its own informers, allows u the first verb of every rule.
func (u User) Grant(ctx context.Context, cfg *envconf.Config, ns, name string, rules ...rbacv1.PolicyRule) error {
	r := cfg.Client().Resources(ns)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: rules}
	if err := r.Create(ctx, role); err != nil {
		return fmt.Errorf("creating role %s/%s: %w", ns, name, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: u.Name}},
	}
	if err := r.Create(ctx, rb); err != nil {
		return fmt.Errorf("creating role binding %s/%s: %w", ns, name, err)
	}
	for _, rule := range rules {
		if len(rule.Verbs) == 0 || len(rule.Resources) == 0 {
			continue
		}
		attrs := &authorizationv1.ResourceAttributes{Namespace: ns, Verb: rule.Verbs[0], Resource: rule.Resources[0]}
		if len(rule.APIGroups) > 0 {
			attrs.Group = rule.APIGroups[0]
		}
		if len(rule.ResourceNames) > 0 {
			attrs.Name = rule.ResourceNames[0]
		}
		allowed := func(ctx context.Context) (bool, error) {
			review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: u.Name, Groups: append([]string{"system:authenticated"}, u.Groups...), ResourceAttributes: attrs,
			}}
			if err := cfg.Client().Resources().Create(ctx, review); err != nil {
				return false, err
			}
			return review.Status.Allowed, nil
		}
		if err := WaitFor(ctx, fmt.Sprintf("user %s to be allowed to %s %s", u.Name, attrs.Verb, attrs.Resource), 30*time.Second, allowed); err != nil {
			return err
		}
	}
	return nil
}

// Kubeconfig writes, into dir, a kubeconfig that acts as u with the suite's
// own credentials, for a program the test runs (the dispatcher, kubectl),
// and returns its path.
func (u User) Kubeconfig(cfg *envconf.Config, dir string) (string, error) {
	kc, err := clientcmd.LoadFromFile(cfg.KubeconfigFile())
	if err != nil {
		return "", fmt.Errorf("reading the suite's kubeconfig: %w", err)
	}
	if err := clientcmd.ResolveLocalPaths(kc); err != nil {
		return "", fmt.Errorf("resolving the suite's kubeconfig's paths: %w", err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil || kc.AuthInfos[ctx.AuthInfo] == nil {
		return "", fmt.Errorf("the suite's kubeconfig has no credentials for its current context %q", kc.CurrentContext)
	}
	auth := kc.AuthInfos[ctx.AuthInfo]
	auth.Impersonate = u.Name
	auth.ImpersonateGroups = append([]string{"system:authenticated"}, u.Groups...)
	path := filepath.Join(dir, "kubeconfig-"+strings.NewReplacer(":", "-", "/", "-").Replace(u.Name))
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("writing a kubeconfig for user %s: %w", u.Name, err)
	}
	return path, nil
}

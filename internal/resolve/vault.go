package resolve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	vault "github.com/hashicorp/vault/api"
	kubeauth "github.com/hashicorp/vault/api/auth/kubernetes"
)

// VaultOptions configure the Vault store, as the webhook's policies set the
// init container's variables (secretstores.rego).
type VaultOptions struct {
	// Address is Vault's address (VAULT_ADDR).
	Address string
	// Namespace is the default Vault namespace (VAULT_NAMESPACE); a
	// reference's @namespace wins.
	Namespace string
	// Token authenticates with a token (VAULT_TOKEN).
	Token string
	// Role, Mount and TokenFile authenticate with Vault's Kubernetes auth:
	// the pod's projected service account token (VAULT_AUTH_ROLE,
	// VAULT_AUTH_MOUNT, VAULT_TOKEN_FILE).
	Role, Mount, TokenFile string
}

// VaultOptionsFromEnv reads VaultOptions from the variables the policies
// give the init container.
func VaultOptionsFromEnv(getenv func(string) string) VaultOptions {
	return VaultOptions{
		Address: getenv("VAULT_ADDR"), Namespace: getenv("VAULT_NAMESPACE"), Token: getenv("VAULT_TOKEN"),
		Role: getenv("VAULT_AUTH_ROLE"), Mount: getenv("VAULT_AUTH_MOUNT"), TokenFile: getenv("VAULT_TOKEN_FILE"),
	}
}

// Vault reads KV secrets (version 1 or 2, found per mount as Vault's own CLI
// finds it) through Vault's official Go client.
type Vault struct {
	client *vault.Client
}

// NewVault logs in to Vault: with the token, or with Kubernetes auth.
func NewVault(ctx context.Context, o VaultOptions) (*Vault, error) {
	if o.Address == "" {
		return nil, errors.New("vault: no address (VAULT_ADDR)")
	}
	cfg := vault.DefaultConfig()
	if cfg.Error != nil {
		return nil, fmt.Errorf("vault: %w", cfg.Error)
	}
	cfg.Address = o.Address
	cfg.MaxRetries = 0 // Resolve tries again, bounded
	c, err := vault.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	c.ClearToken()
	if o.Namespace != "" {
		c.SetNamespace(o.Namespace)
	}
	switch {
	case o.Role != "":
		mount := o.Mount
		if mount == "" {
			mount = "kubernetes"
		}
		auth, err := kubeauth.NewKubernetesAuth(o.Role, kubeauth.WithServiceAccountTokenPath(o.TokenFile), kubeauth.WithMountPath(mount))
		if err != nil {
			return nil, fmt.Errorf("vault: kubernetes auth: %w", err)
		}
		if _, err := c.Auth().Login(ctx, auth); err != nil {
			return nil, fmt.Errorf("vault: logging in with kubernetes auth (mount %s, role %s): %w", mount, o.Role, classify(err))
		}
	case o.Token != "":
		c.SetToken(o.Token)
	default:
		return nil, errors.New("vault: no token (VAULT_TOKEN) and no kubernetes auth role (VAULT_AUTH_ROLE)")
	}
	return &Vault{client: c}, nil
}

// Fetch reads r.Key of the secret at r.Name, in namespace r.Vault when the
// reference names one.
func (v *Vault) Fetch(ctx context.Context, r Ref) (string, error) {
	c := v.client
	if r.Vault != "" {
		c = c.WithNamespace(r.Vault)
	}
	mount, version, err := kvMount(ctx, c, r.Name)
	if err != nil {
		return "", err
	}
	path := r.Name
	if version == "2" {
		path = mount + "data/" + strings.TrimPrefix(r.Name, mount)
	}
	s, err := c.Logical().ReadWithContext(ctx, path)
	if err != nil {
		return "", fmt.Errorf("vault: reading %s: %w", path, classify(err))
	}
	if s == nil || s.Data == nil {
		return "", fmt.Errorf("vault: no secret at %s: %w", path, ErrNotFound)
	}
	data := s.Data
	if version == "2" {
		inner, ok := s.Data["data"].(map[string]any)
		if !ok {
			return "", fmt.Errorf("vault: no secret at %s (deleted or destroyed?): %w", path, ErrNotFound)
		}
		data = inner
	}
	val, ok := data[r.Key]
	if !ok {
		return "", fmt.Errorf("vault: the secret at %s has no key %q: %w", path, r.Key, ErrNotFound)
	}
	return fieldText(val), nil
}

// kvMount finds the KV mount a path is under and its version, as the vault
// CLI does (sys/internal/ui/mounts, which Vault's default policy allows).
// A Vault that does not answer it is taken as KV version 1 at the path's
// first segment.
func kvMount(ctx context.Context, c *vault.Client, path string) (mount, version string, err error) {
	s, err := c.Logical().ReadWithContext(ctx, "sys/internal/ui/mounts/"+path)
	if err != nil {
		var re *vault.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
			first, _, _ := strings.Cut(path, "/")
			return first + "/", "1", nil
		}
		return "", "", fmt.Errorf("vault: finding the mount of %s: %w", path, classify(err))
	}
	if s == nil || s.Data == nil {
		return "", "", fmt.Errorf("vault: no mount holds %s: %w", path, ErrNotFound)
	}
	mount, _ = s.Data["path"].(string)
	if opts, ok := s.Data["options"].(map[string]any); ok {
		version, _ = opts["version"].(string)
	}
	if mount == "" {
		return "", "", fmt.Errorf("vault: no mount holds %s: %w", path, ErrNotFound)
	}
	return mount, version, nil
}

// classify wraps a Vault client error with ErrDenied, ErrNotFound or
// ErrUnavailable.
func classify(err error) error {
	var re *vault.ResponseError
	if errors.As(err, &re) {
		switch {
		case re.StatusCode == http.StatusForbidden || re.StatusCode == http.StatusUnauthorized:
			return fmt.Errorf("%w: %w", ErrDenied, err)
		case re.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		case re.StatusCode == http.StatusTooManyRequests || re.StatusCode >= 500:
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

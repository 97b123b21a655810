package resolve

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
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
	// KVMounts are the key-value mounts (version 1 or 2) references may
	// read (VAULT_KV_MOUNTS, comma-separated). Default: secret.
	KVMounts []string
	// EngineMounts are mounts of other secrets engines the platform lets
	// references read with a plain read (VAULT_ENGINE_MOUNTS). Default:
	// none.
	EngineMounts []string
}

// vaultReserved are Vault's own paths: never a stored secret, and a read of
// them would hand the resolver's own token or identity to the runner.
var vaultReserved = []string{"sys", "auth", "identity", "cubbyhole"}

// VaultOptionsFromEnv reads VaultOptions from the variables the policies
// give the init container.
func VaultOptionsFromEnv(getenv func(string) string) VaultOptions {
	return VaultOptions{
		Address: getenv("VAULT_ADDR"), Namespace: getenv("VAULT_NAMESPACE"), Token: getenv("VAULT_TOKEN"),
		Role: getenv("VAULT_AUTH_ROLE"), Mount: getenv("VAULT_AUTH_MOUNT"), TokenFile: getenv("VAULT_TOKEN_FILE"),
		KVMounts: mountList(getenv("VAULT_KV_MOUNTS")), EngineMounts: mountList(getenv("VAULT_ENGINE_MOUNTS")),
	}
}

// mountList reads a comma-separated list of mounts.
func mountList(s string) []string {
	var out []string
	for m := range strings.SplitSeq(s, ",") {
		if m = strings.Trim(strings.TrimSpace(m), "/"); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// Vault reads KV secrets (version 1 or 2, found per mount as Vault's own CLI
// finds it) through Vault's official Go client, only under the mounts the
// platform names, and only from a mount of the type it was named as.
type Vault struct {
	client *vault.Client
	// kind maps each mount the platform names ("secret/") to mountKV or
	// mountEngine.
	kind map[string]string
}

// The kinds of mount a reference may read.
const (
	mountKV     = "kv"
	mountEngine = "engine"
)

// NewVault logs in to Vault: with the token, or with Kubernetes auth.
func NewVault(ctx context.Context, o VaultOptions) (*Vault, error) {
	if o.Address == "" {
		return nil, errors.New("vault: no address (VAULT_ADDR)")
	}
	kind, err := vaultMounts(o)
	if err != nil {
		return nil, err
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
	return &Vault{client: c, kind: kind}, nil
}

// vaultMounts maps the mounts of o to their kinds, refusing Vault's own.
func vaultMounts(o VaultOptions) (map[string]string, error) {
	kv := o.KVMounts
	if len(kv) == 0 {
		kv = []string{"secret"}
	}
	kind := map[string]string{}
	for _, set := range []struct {
		mounts []string
		kind   string
	}{{kv, mountKV}, {o.EngineMounts, mountEngine}} {
		for _, m := range set.mounts {
			m = strings.Trim(m, "/")
			first, _, _ := strings.Cut(m, "/")
			if m == "" || slices.Contains(vaultReserved, first) {
				return nil, fmt.Errorf("vault: mount %q may not be read by references: %s are Vault's own paths (VAULT_KV_MOUNTS, VAULT_ENGINE_MOUNTS)", m, strings.Join(vaultReserved, ", "))
			}
			kind[m+"/"] = set.kind
		}
	}
	return kind, nil
}

// allowedMount returns the mount the platform names that path is under, or
// "" when there is none.
func (v *Vault) allowedMount(path string) string {
	best := ""
	for m := range v.kind {
		if strings.HasPrefix(path, m) && len(m) > len(best) {
			best = m
		}
	}
	return best
}

// Fetch reads r.Key of the secret at r.Name, in namespace r.Vault when the
// reference names one.
func (v *Vault) Fetch(ctx context.Context, r Ref) (string, error) {
	named := v.allowedMount(r.Name)
	if named == "" {
		return "", fmt.Errorf("vault: %s is under no mount the platform names (%s): %w", r.Name, strings.Join(slices.Sorted(maps.Keys(v.kind)), ", "), ErrRefused)
	}
	c := v.client
	if r.Vault != "" {
		c = c.WithNamespace(r.Vault)
	}
	mount, typ, version, err := mountOf(ctx, c, r.Name)
	if err != nil {
		return "", err
	}
	// The mount Vault answers must be the one named, and of its kind: a
	// mount of another engine at a named path, or one nested inside it, is
	// not read.
	if mount != named {
		return "", fmt.Errorf("vault: %s is in mount %s, which the platform does not name: %w", r.Name, mount, ErrRefused)
	}
	if v.kind[named] == mountKV && typ != "kv" && typ != "generic" {
		return "", fmt.Errorf("vault: mount %s is a %q mount, not key-value, and is named as a key-value mount: %w", mount, typ, ErrRefused)
	}
	path := r.Name
	if v.kind[named] == mountKV && version == "2" {
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
	if v.kind[named] == mountKV && version == "2" {
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

// mountOf finds the mount a path is under, its type and its KV version, as
// the vault CLI does (sys/internal/ui/mounts, which Vault's default policy
// allows). A Vault that cannot say is refused, never guessed at.
func mountOf(ctx context.Context, c *vault.Client, path string) (mount, typ, version string, err error) {
	s, err := c.Logical().ReadWithContext(ctx, "sys/internal/ui/mounts/"+path)
	if err != nil {
		return "", "", "", fmt.Errorf("vault: finding the mount of %s: %w", path, classify(err))
	}
	if s == nil || s.Data == nil {
		return "", "", "", fmt.Errorf("vault: no mount holds %s: %w", path, ErrNotFound)
	}
	mount, _ = s.Data["path"].(string)
	typ, _ = s.Data["type"].(string)
	if opts, ok := s.Data["options"].(map[string]any); ok {
		version, _ = opts["version"].(string)
	}
	if mount == "" {
		return "", "", "", fmt.Errorf("vault: no mount holds %s: %w", path, ErrNotFound)
	}
	return mount, typ, version, nil
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

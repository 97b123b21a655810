// Package resolve fetches the values of a runner's secret references
// (${vault:...}, ${ssm:...}, ...) from their stores and writes them to an env
// file the kubelet reads for the runner container (EnvFiles: fileKeyRef).
// It runs in the runner pod's trusted init container, the only container
// that holds the stores' credentials: the runner gets the values and nothing
// else. The webhook writes the plan (Var) into the init container; see
// docs/secrets.md.
package resolve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Names the webhook and the dispatcher agree on.
const (
	// InitContainer is the name of the init container that resolves.
	InitContainer = "runwarden-secrets"
	// Volume is the in-memory emptyDir the env file is written to.
	Volume = "runwarden-secrets"
	// MountPath is where the init container mounts Volume.
	MountPath = "/run/runwarden/secrets"
	// EnvFile is the env file's path inside Volume.
	EnvFile = "secrets.env"
	// SpecEnv is the init container's variable holding the plan (JSON).
	SpecEnv = "RUNWARDEN_SECRET_REFS"
	// FileSuffix names the variable that holds a value's file, with
	// delivery "files": DB_PASSWORD becomes DB_PASSWORD_FILE.
	FileSuffix = "_FILE"
)

// Deliveries: how the values reach the runner.
const (
	// DeliveryEnvFile: each variable from the env file (fileKeyRef;
	// Kubernetes EnvFiles, on by default since 1.35). The default.
	DeliveryEnvFile = "envFile"
	// DeliveryFiles: each value in a file of its own on the in-memory
	// volume, mounted read-only, named by the variable NAME_FILE; NAME is
	// not set. For clusters without EnvFiles.
	DeliveryFiles = "files"
)

// Var is one runner variable whose value holds secret references: its value
// as the task wrote it, with each reference replaced by the secret, goes into
// the env file under Key.
type Var struct {
	// Key is the variable's key in the env file.
	Key string `json:"key"`
	// Container and Env name the variable, for messages.
	Container string `json:"container"`
	Env       string `json:"env"`
	// Value is the value as written, references included.
	Value string `json:"value"`
	// Refs are the references in Value, in order.
	Refs []Ref `json:"refs"`
}

// Ref is one secret reference, parsed (see the webhook's ParseSecretRef).
type Ref struct {
	// Store is ssm, gcp, azure or vault.
	Store string `json:"store"`
	// Name is the secret's name in its store.
	Name string `json:"name"`
	// Vault is the Azure Key Vault name or the Vault namespace.
	Vault string `json:"vault,omitempty"`
	// Key is the Vault key.
	Key string `json:"key,omitempty"`
	// Raw is the reference as written.
	Raw string `json:"raw"`
}

// Store fetches a secret's value. Its errors never hold a value.
type Store interface {
	Fetch(ctx context.Context, r Ref) (string, error)
}

// Errors a Store wraps, so messages say why and only ErrUnavailable is
// tried again.
var (
	ErrNotFound    = errors.New("not found")
	ErrDenied      = errors.New("access denied")
	ErrUnavailable = errors.New("store unavailable")
	// ErrRefused: the reference names something the platform does not
	// let references read (a Vault mount it does not name, or of another
	// type); nothing was read.
	ErrRefused = errors.New("refused by the platform configuration")
)

// Options shape Resolve.
type Options struct {
	// Attempts bounds the tries of a reference whose store is unavailable.
	// Default: 5.
	Attempts int
	// Backoff is the first wait between tries, doubled each time. Default: 1s.
	Backoff time.Duration
}

// Resolve returns each Var's value with its references replaced, keyed by
// Var.Key. A reference to a store without an entry in stores, or one that
// cannot be fetched, fails the whole plan with a message naming the
// container, the variable and the reference, never a value.
func Resolve(ctx context.Context, vars []Var, stores map[string]Store, o Options) (map[string]string, error) {
	if o.Attempts <= 0 {
		o.Attempts = 5
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	fetched := map[string]string{}
	out := make(map[string]string, len(vars))
	for _, v := range vars {
		// Each reference is replaced where it stands in the value as
		// written: a secret holding a reference's text is never read as one.
		var value strings.Builder
		rest := v.Value
		for _, r := range v.Refs {
			i := strings.Index(rest, r.Raw)
			if i < 0 {
				return nil, fmt.Errorf("container %s env %s: %s is not in the variable's value", v.Container, v.Env, r.Raw)
			}
			value.WriteString(rest[:i])
			rest = rest[i+len(r.Raw):]
			secret, ok := fetched[r.Raw]
			if !ok {
				s := stores[r.Store]
				if s == nil {
					return nil, fmt.Errorf("container %s env %s: %s: store %q is not enabled in the platform configuration", v.Container, v.Env, r.Raw, r.Store)
				}
				var err error
				if secret, err = fetch(ctx, s, r, o); err != nil {
					return nil, fmt.Errorf("container %s env %s: %s: %w", v.Container, v.Env, r.Raw, err)
				}
				fetched[r.Raw] = secret
			}
			value.WriteString(secret)
		}
		value.WriteString(rest)
		out[v.Key] = value.String()
	}
	return out, nil
}

func fetch(ctx context.Context, s Store, r Ref, o Options) (string, error) {
	wait := o.Backoff
	for attempt := 1; ; attempt++ {
		v, err := s.Fetch(ctx, r)
		if err == nil || !errors.Is(err, ErrUnavailable) || attempt >= o.Attempts {
			if err != nil && errors.Is(err, ErrUnavailable) {
				return "", fmt.Errorf("%w (after %d tries)", err, attempt)
			}
			return v, err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w (after %d tries)", err, attempt)
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// maxLine is the longest line the kubelet's env file reader takes (its
// scanner's 64 KiB), less room for the key.
const maxLine = 60 << 10

// WriteEnvFile writes the values as the kubelet's env file format wants
// them: KEY='value', one per line, the value taken literally. That format
// has no escape: a value holding a single quote, an empty value (the
// kubelet reads it as missing), a NUL or a line past 60 KiB cannot be
// written, and is an error naming its variable. The file is written whole
// or not at all.
func WriteEnvFile(path string, values map[string]string, vars []Var) error {
	name := map[string]string{}
	for _, v := range vars {
		name[v.Key] = fmt.Sprintf("container %s env %s", v.Container, v.Env)
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		v := values[k]
		var problem string
		switch {
		case v == "":
			problem = "resolves to an empty value, which an env file cannot deliver"
		case strings.Contains(v, "'"):
			problem = "resolves to a value holding a single quote, which an env file cannot deliver"
		case strings.ContainsRune(v, 0):
			problem = "resolves to a value holding a NUL byte"
		case slices.ContainsFunc(strings.Split(v, "\n"), func(l string) bool { return len(l) > maxLine }):
			problem = fmt.Sprintf("resolves to a value with a line longer than %d bytes", maxLine)
		}
		if problem != "" {
			return fmt.Errorf("%s %s", name[k], problem)
		}
		b.WriteString(k)
		b.WriteString("='")
		b.WriteString(v)
		b.WriteString("'\n")
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".secrets-*")
	if err != nil {
		return fmt.Errorf("writing the env file: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.WriteString(b.String()); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing the env file: %w", err)
	}
	if err := tmp.Chmod(0o400); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing the env file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing the env file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing the env file: %w", err)
	}
	return nil
}

// WriteFiles writes each value to a file named by its key in dir, readable
// by the pod's containers (delivery "files"). Any value can be written.
func WriteFiles(dir string, values map[string]string) error {
	for k, v := range values {
		tmp, err := os.CreateTemp(dir, ".secret-*")
		if err != nil {
			return fmt.Errorf("writing the value files: %w", err)
		}
		_, werr := tmp.WriteString(v)
		cerr := tmp.Chmod(0o444)
		if err := errors.Join(werr, cerr, tmp.Close()); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("writing the value files: %w", err)
		}
		if err := os.Rename(tmp.Name(), filepath.Join(dir, k)); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("writing the value files: %w", err)
		}
	}
	return nil
}

// fieldText is a field of a JSON secret as a variable gets it: a string as
// it is, anything else as JSON.
func fieldText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v) // decoded from JSON: it encodes again
	return string(b)
}

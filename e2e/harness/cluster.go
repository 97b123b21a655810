// Package harness is the shared part of runwarden's e2e suites: it picks the
// cluster the suites run against, gives every feature a fresh namespace, waits
// on conditions with a deadline, and dumps a namespace's objects and events
// when a test fails.
package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"sigs.k8s.io/e2e-framework/pkg/env"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/envfuncs"
	"sigs.k8s.io/e2e-framework/support/kind"
)

// Environment variables that choose and shape the cluster.
const (
	// EnvCluster selects the cluster: "local" (default), "kind" or "existing".
	EnvCluster = "RUNWARDEN_E2E_CLUSTER"
	// EnvKeep, when "true", leaves a cluster the suite created running after
	// the suite, for debugging.
	EnvKeep = "RUNWARDEN_E2E_KEEP"
	// EnvClusterName overrides the name of the cluster the suite creates
	// (default: runwarden-e2e).
	EnvClusterName = "RUNWARDEN_E2E_CLUSTER_NAME"
)

// Cluster kinds accepted in EnvCluster.
const (
	ClusterLocal    = "local"
	ClusterKind     = "kind"
	ClusterExisting = "existing"
)

// ErrUnknownCluster is returned for a value of EnvCluster that is not a known kind.
var ErrUnknownCluster = errors.New("unknown e2e cluster kind")

// Config says which cluster a suite runs against.
type Config struct {
	// Kind is one of ClusterLocal, ClusterKind or ClusterExisting. Default: ClusterLocal.
	Kind string
	// Name is the name of the cluster the suite creates. Default: runwarden-e2e.
	Name string
	// Keep leaves a created cluster running after the suite. Default: false.
	Keep bool
	// Kubeconfig is the kubeconfig of an existing cluster. Default: $KUBECONFIG,
	// then ~/.kube/config.
	Kubeconfig string
	// RepoRoot is the checkout's top folder. Default: found from the working
	// directory by looking for go.mod.
	RepoRoot string
}

// ConfigFromEnv reads the suite's Config from the environment.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		Kind:       getenv(EnvCluster),
		Name:       getenv(EnvClusterName),
		Keep:       getenv(EnvKeep) == "true",
		Kubeconfig: getenv("KUBECONFIG"),
	}
	if err := c.setDefaults(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c *Config) setDefaults() error {
	if c.Kind == "" {
		c.Kind = ClusterLocal
	}
	switch c.Kind {
	case ClusterLocal, ClusterKind, ClusterExisting:
	default:
		return fmt.Errorf("%w %q in %s: use %q, %q or %q", ErrUnknownCluster, c.Kind, EnvCluster,
			ClusterLocal, ClusterKind, ClusterExisting)
	}
	if c.Name == "" {
		c.Name = "runwarden-e2e"
	}
	if c.Kubeconfig == "" {
		if home, err := os.UserHomeDir(); err == nil {
			c.Kubeconfig = filepath.Join(home, ".kube", "config")
		}
	}
	if c.RepoRoot == "" {
		root, err := findRepoRoot()
		if err != nil {
			return err
		}
		c.RepoRoot = root
	}
	return nil
}

// findRepoRoot walks up from the working directory to the folder that holds
// runwarden's go.mod.
func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the checkout: %w", err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/runwarden/runwarden\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding the checkout: no runwarden go.mod above the working directory")
		}
		dir = parent
	}
}

// NewEnvironment returns an e2e-framework environment whose Setup brings up
// (or connects to) the cluster c names and whose Finish tears down what Setup
// created.
func NewEnvironment(c Config) env.Environment {
	cfg := envconf.New()
	e := env.NewWithConfig(cfg)
	switch c.Kind {
	case ClusterExisting:
		cfg.WithKubeconfigFile(c.Kubeconfig)
	case ClusterKind:
		e.Setup(envfuncs.CreateCluster(kind.NewProvider(), c.Name))
		if !c.Keep {
			e.Finish(envfuncs.DestroyCluster(c.Name))
		}
	default:
		e.Setup(localUp(c))
		if !c.Keep {
			e.Finish(localDown(c))
		}
	}
	e.BeforeEachFeature(createFeatureNamespace)
	e.AfterEachFeature(deleteFeatureNamespace)
	return e
}

// localUp starts the local control plane with the same script `make
// cluster-up` runs, so the suite and developers share one way to build it.
func localUp(c Config) env.Func {
	return func(ctx context.Context, cfg *envconf.Config) (context.Context, error) {
		if err := clusterScript(ctx, c, "up"); err != nil {
			return ctx, err
		}
		out, err := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "cluster.sh"), "kubeconfig", "--name", c.Name).Output()
		if err != nil {
			return ctx, fmt.Errorf("finding the kubeconfig of local cluster %s: %w", c.Name, err)
		}
		cfg.WithKubeconfigFile(strings.TrimSpace(string(out)))
		return ctx, nil
	}
}

func localDown(c Config) env.Func {
	return func(ctx context.Context, _ *envconf.Config) (context.Context, error) {
		err := clusterScript(ctx, c, "down")
		if err != nil {
			teardown.Lock()
			teardown.err = err
			teardown.Unlock()
		}
		return ctx, err
	}
}

// teardown holds the error of stopping the local cluster: e2e-framework only
// logs the errors of Finish steps, and a cluster left running must fail the run.
var teardown struct {
	sync.Mutex
	err error
}

// TeardownError returns why stopping the local cluster failed, if it did.
func TeardownError() error {
	teardown.Lock()
	defer teardown.Unlock()
	return teardown.err
}

// StopLocal stops the local cluster c names, when the suite started it and
// may remove it (not kept): what Finish does, for a run that is interrupted.
func StopLocal(c Config) error {
	if c.Kind != ClusterLocal || c.Keep {
		return nil
	}
	return clusterScript(context.Background(), c, "down")
}

func clusterScript(ctx context.Context, c Config, verb string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.RepoRoot, "hack", "cluster.sh"), verb, "--name", c.Name)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hack/cluster.sh %s --name %s: %w", verb, c.Name, err)
	}
	return nil
}

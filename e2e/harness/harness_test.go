package harness

import (
	"errors"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr error
	}{
		{
			name: "defaults to the local cluster",
			env:  map[string]string{"KUBECONFIG": "/k"},
			want: Config{Kind: ClusterLocal, Name: "runwarden-e2e", Kubeconfig: "/k", RepoRoot: "/repo"},
		},
		{
			name: "existing cluster keeps KUBECONFIG",
			env:  map[string]string{EnvCluster: "existing", "KUBECONFIG": "/other"},
			want: Config{Kind: ClusterExisting, Name: "runwarden-e2e", Kubeconfig: "/other", RepoRoot: "/repo"},
		},
		{
			name: "kind with a name and keep",
			env:  map[string]string{EnvCluster: "kind", EnvClusterName: "mine", EnvKeep: "true", "KUBECONFIG": "/k"},
			want: Config{Kind: ClusterKind, Name: "mine", Keep: true, Kubeconfig: "/k", RepoRoot: "/repo"},
		},
		{
			name:    "unknown kind is refused",
			env:     map[string]string{EnvCluster: "minikube"},
			wantErr: ErrUnknownCluster,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			getenv := func(k string) string { return tt.env[k] }
			c := Config{
				Kind: getenv(EnvCluster), Name: getenv(EnvClusterName), Keep: getenv(EnvKeep) == "true",
				Kubeconfig: getenv("KUBECONFIG"), RepoRoot: "/repo",
			}
			err := c.setDefaults()
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("setDefaults() error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			if diff := cmp.Diff(tt.want, c); diff != "" {
				t.Errorf("config mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigFromEnvFindsRepoRoot(t *testing.T) {
	t.Parallel()
	c, err := ConfigFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatalf("ConfigFromEnv: %v", err)
	}
	if c.RepoRoot == "" {
		t.Fatal("RepoRoot is empty")
	}
}

func TestNamespaceName(t *testing.T) {
	t.Parallel()
	valid := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	tests := []struct {
		name    string
		feature string
		prefix  string
	}{
		{name: "plain words", feature: "job completes", prefix: "e2e-job-completes-"},
		{name: "symbols and case", feature: "Runner Pool: needs_toleration!", prefix: "e2e-runner-pool-needs-toleration-"},
		{name: "empty", feature: "", prefix: "e2e-feature-"},
		{name: "long", feature: "a very long feature name that goes on and on beyond any limit", prefix: "e2e-a-very-long-feature-name-that-goes-on-an-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := namespaceName(tt.feature)
			if len(got) > 63 || !valid.MatchString(got) {
				t.Errorf("namespaceName(%q) = %q, not a valid namespace name", tt.feature, got)
			}
			if len(got) != len(tt.prefix)+6 || got[:len(tt.prefix)] != tt.prefix {
				t.Errorf("namespaceName(%q) = %q, want prefix %q and 6 random hex digits", tt.feature, got, tt.prefix)
			}
			if other := namespaceName(tt.feature); other == got {
				t.Errorf("namespaceName(%q) returned %q twice", tt.feature, got)
			}
		})
	}
}

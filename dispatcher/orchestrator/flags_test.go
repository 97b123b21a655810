package orchestrator

import (
	"crypto/ed25519"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/runwarden/runwarden/dispatcher/runner"
)

// parseConfig binds a Config's flags on a fresh FlagSet and parses args.
func parseConfig(t *testing.T, args ...string) *Config {
	t.Helper()
	var c Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.Bind(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &c
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := parseConfig(t)
	if c.pollWait != 30*time.Second || c.retryMax != time.Minute || !c.streamLogs {
		t.Errorf("poll wait %s, retry max %s, stream logs %t; want 30s, 1m, true", c.pollWait, c.retryMax, c.streamLogs)
	}
}

func TestConfigCheck(t *testing.T) {
	t.Parallel()
	valid := []string{"--orchestrator-url", "https://o.example", "--orchestrator-key", "k.pem"}
	tests := []struct {
		name      string
		args      []string
		namespace string
		want      string // the error, "" for none
	}{
		{name: "valid", args: valid, namespace: "runners"},
		{name: "token file", args: []string{"--orchestrator-url", "https://o.example", "--orchestrator-token-file", "t"}, namespace: "runners"},
		{name: "exchange", args: []string{"--orchestrator-url", "https://o.example", "--orchestrator-exchange-token-file", "t"}, namespace: "runners"},
		{name: "no url", args: []string{"--orchestrator-key", "k.pem"}, namespace: "runners", want: "--source=orchestrator needs --orchestrator-url"},
		{name: "no namespace", args: valid, want: "--source=orchestrator needs --namespace, where its Jobs run"},
		{name: "no credentials", args: []string{"--orchestrator-url", "https://o.example"}, namespace: "runners", want: "--source=orchestrator needs one of --orchestrator-key, --orchestrator-token-file and --orchestrator-exchange-token-file"},
		{
			name: "two credentials", args: append([]string{"--orchestrator-token-file", "t"}, valid...), namespace: "runners",
			want: "--orchestrator-key, --orchestrator-token-file and --orchestrator-exchange-token-file: give only one",
		},
		{name: "poll wait under a second", args: append([]string{"--poll-wait", "10ms"}, valid...), namespace: "runners", want: "--poll-wait 10ms: must be at least 1s"},
		{name: "retry delay under a second", args: append([]string{"--retry-max-delay", "999ms"}, valid...), namespace: "runners", want: "--retry-max-delay 999ms: must be at least 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := parseConfig(t, tt.args...).Check(runner.Shared{DispatcherID: "d", Namespace: tt.namespace})
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Check: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("Check: %v, want %q", err, tt.want)
			}
		})
	}
}

// The flags name the Authenticator; a JWT's kid is the dispatcher ID unless
// --orchestrator-key-id names another.
func TestConfigAuth(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := writeKey(t, key)
	url := "https://o.example"
	tests := []struct {
		name string
		args []string
		want Authenticator
	}{
		{name: "key", args: []string{"--orchestrator-key", keyFile}, want: &JWT{Key: key, KeyID: "d", Subject: "d", Audience: url}},
		{name: "key with its id", args: []string{"--orchestrator-key", keyFile, "--orchestrator-key-id", "team-a/d"}, want: &JWT{Key: key, KeyID: "team-a/d", Subject: "d", Audience: url}},
		{name: "token file", args: []string{"--orchestrator-token-file", "/t"}, want: &TokenFile{Path: "/t"}},
		{name: "exchange", args: []string{"--orchestrator-exchange-token-file", "/x"}, want: &Exchange{Path: "/x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseConfig(t, append([]string{"--orchestrator-url", url}, tt.args...)...).auth("d")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(describe(tt.want), describe(got)); diff != "" {
				t.Errorf("auth (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConfigAuthReportsAKeyItCannotRead(t *testing.T) {
	t.Parallel()
	_, err := parseConfig(t, "--orchestrator-url", "https://o.example", "--orchestrator-key", "/nonexistent/runner.key").auth("d")
	if err == nil || !strings.Contains(err.Error(), "reading the private key") {
		t.Errorf("auth: %v, want the key file's error", err)
	}
}

// describe is what an Authenticator was made from: its kind and fields.
func describe(a Authenticator) []string {
	switch a := a.(type) {
	case *JWT:
		return []string{"JWT", string(a.Key), a.KeyID, a.Subject, a.Audience}
	case *TokenFile:
		return []string{"TokenFile", a.Path}
	case *Exchange:
		return []string{"Exchange", a.Path}
	}
	return []string{fmt.Sprintf("%T", a)}
}

package orchestrator

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/runwarden/runwarden/dispatcher/runner"
)

// Config is the orchestrator source's part of the dispatcher's command
// line: its flags with their defaults and checks, and setting it up on the
// manager. It is the runner.Source the dispatcher offers as
// --source=orchestrator.
type Config struct {
	url string
	// keyFile, tokenFile and exchangeFile are the three ways to
	// authenticate; exactly one is given.
	keyFile, tokenFile, exchangeFile string
	// keyID is the JWTs' kid; default: the dispatcher ID.
	keyID      string
	caFile     string
	proxy      string
	pollWait   time.Duration
	retryMax   time.Duration
	streamLogs bool
}

var _ runner.Source = (*Config)(nil)

// Name implements runner.Source.
func (*Config) Name() string { return "orchestrator" }

// Summary implements runner.Source.
func (*Config) Summary() string { return "a remote orchestrator over HTTPS" }

// Bind implements runner.Source.
func (c *Config) Bind(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "orchestrator-url", "", "the orchestrator's base URL (https), for --source=orchestrator")
	fs.StringVar(&c.keyFile, "orchestrator-key", "", "Ed25519 private key (PKCS #8 PEM) that signs this dispatcher's short-lived JWTs, one per request")
	fs.StringVar(&c.keyID, "orchestrator-key-id", "", "kid of the JWTs: the name the orchestrator registered this dispatcher's public key under; it takes a JWT only for the dispatcher that key is registered for (default: the dispatcher ID)")
	fs.StringVar(&c.tokenFile, "orchestrator-token-file", "", "file holding a static bearer token, read again when it changes")
	fs.StringVar(&c.exchangeFile, "orchestrator-exchange-token-file", "", "projected service account token exchanged at the orchestrator for its own token")
	fs.StringVar(&c.caFile, "orchestrator-ca", "", "PEM bundle of CAs trusted for the orchestrator, besides the system's")
	fs.StringVar(&c.proxy, "orchestrator-proxy", "", "HTTPS proxy URL for the orchestrator (default: $HTTPS_PROXY and $NO_PROXY)")
	fs.DurationVar(&c.pollWait, "poll-wait", 30*time.Second, "how long the orchestrator may hold a poll")
	fs.DurationVar(&c.retryMax, "retry-max-delay", time.Minute, "longest wait between retries when the orchestrator is unreachable (exponential from 1s, full jitter)")
	fs.BoolVar(&c.streamLogs, "stream-logs", true, "send the runner container's log to the orchestrator")
}

// Check implements runner.Source: the orchestrator's URL, one way to
// authenticate, and --namespace, where its Jobs run, are required.
func (c *Config) Check(s runner.Shared) error {
	auth := 0
	for _, f := range []string{c.keyFile, c.tokenFile, c.exchangeFile} {
		if f != "" {
			auth++
		}
	}
	switch {
	case c.url == "":
		return errors.New("--source=orchestrator needs --orchestrator-url")
	case s.Namespace == "":
		return errors.New("--source=orchestrator needs --namespace, where its Jobs run")
	case auth == 0:
		return errors.New("--source=orchestrator needs one of --orchestrator-key, --orchestrator-token-file and --orchestrator-exchange-token-file")
	case auth > 1:
		return errors.New("--orchestrator-key, --orchestrator-token-file and --orchestrator-exchange-token-file: give only one")
	case c.pollWait < time.Second:
		return fmt.Errorf("--poll-wait %s: must be at least 1s", c.pollWait)
	case c.retryMax < time.Second:
		return fmt.Errorf("--retry-max-delay %s: must be at least 1s", c.retryMax)
	}
	return nil
}

// Setup implements runner.Source: a Source with its Client.
func (c *Config) Setup(s runner.Setup) error {
	auth, err := c.auth(s.DispatcherID)
	if err != nil {
		return err
	}
	oc, err := NewClient(ClientOptions{
		URL: c.url, DispatcherID: s.DispatcherID, Auth: auth, CAFile: c.caFile, Proxy: c.proxy,
	})
	if err != nil {
		return err
	}
	var logs runner.LogReader
	if c.streamLogs {
		logs = s.Logs
	}
	src := New(Options{
		Options: s.Limits,
		Client:  oc, Kube: s.Client, Reader: s.Manager.GetAPIReader(), Jobs: s.Jobs, Namespace: s.Namespace,
		PollWait: c.pollWait,
		Backoff:  Backoff{Base: time.Second, Max: c.retryMax},
		Logs:     logs, Recorder: s.Recorder,
	})
	return src.SetupWithManager(s.Manager)
}

// auth is the Authenticator the flags name, for dispatcher id.
func (c *Config) auth(id string) (Authenticator, error) {
	switch {
	case c.keyFile != "":
		key, err := LoadEd25519Key(c.keyFile)
		if err != nil {
			return nil, err
		}
		kid := c.keyID
		if kid == "" {
			kid = id
		}
		return &JWT{Key: key, KeyID: kid, Subject: id, Audience: c.url}, nil
	case c.tokenFile != "":
		return &TokenFile{Path: c.tokenFile}, nil
	default:
		return &Exchange{Path: c.exchangeFile}, nil
	}
}

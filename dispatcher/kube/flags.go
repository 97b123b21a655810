package kube

import (
	"flag"
	"fmt"

	"github.com/runwarden/runwarden/dispatcher/runner"
)

// maxKeepLogBytes bounds --keep-log-bytes: a ConfigMap holds at most 1 MiB,
// keys and metadata included.
const maxKeepLogBytes = 900 * 1024

// Config is the kube source's part of the dispatcher's command line: its
// flags with their defaults and checks, and setting it up on the manager.
// It is the runner.Source the dispatcher offers as --source=kube.
type Config struct {
	// keepLogBytes is --keep-log-bytes: how much of a finished task's log
	// is kept in a ConfigMap.
	keepLogBytes int
}

var _ runner.Source = (*Config)(nil)

// Name implements runner.Source.
func (*Config) Name() string { return "kube" }

// Summary implements runner.Source.
func (*Config) Summary() string { return "RunnerTask objects" }

// Bind implements runner.Source.
func (c *Config) Bind(fs *flag.FlagSet) {
	fs.IntVar(&c.keepLogBytes, "keep-log-bytes", 256*1024, "with --source=kube, how much of the end of a finished task's runner log is kept in a ConfigMap (status.logConfigMap) after its Job is gone; 0 keeps none")
}

// Check implements runner.Source.
func (c *Config) Check(runner.Shared) error {
	if c.keepLogBytes < 0 || c.keepLogBytes > maxKeepLogBytes {
		return fmt.Errorf("--keep-log-bytes %d: between 0 and %d (a ConfigMap holds at most 1 MiB)", c.keepLogBytes, maxKeepLogBytes)
	}
	return nil
}

// Setup implements runner.Source: a Reconciler of RunnerTasks.
func (c *Config) Setup(s runner.Setup) error {
	r := New(Options{
		Options:      s.Limits,
		Logs:         s.Logs,
		KeepLogBytes: c.keepLogBytes,
		Client:       s.Client,
		Jobs:         s.Jobs,
		Reader:       s.Manager.GetAPIReader(),
		Recorder:     s.Recorder,
	})
	return r.SetupWithManager(s.Manager)
}

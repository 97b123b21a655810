package kube

import (
	"flag"
	"io"
	"testing"

	"github.com/runwarden/runwarden/dispatcher/runner"
)

func TestConfigKeepLogBytes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want int
		err  string // the error, "" for none
	}{
		{name: "default", want: 256 * 1024},
		{name: "none", args: []string{"--keep-log-bytes", "0"}, want: 0},
		{name: "most", args: []string{"--keep-log-bytes", "921600"}, want: 900 * 1024},
		{name: "past a ConfigMap", args: []string{"--keep-log-bytes", "921601"}, err: "--keep-log-bytes 921601: between 0 and 921600 (a ConfigMap holds at most 1 MiB)"},
		{name: "negative", args: []string{"--keep-log-bytes", "-1"}, err: "--keep-log-bytes -1: between 0 and 921600 (a ConfigMap holds at most 1 MiB)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c Config
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c.Bind(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := c.Check(runner.Shared{DispatcherID: "d"})
			switch {
			case tt.err != "" && (err == nil || err.Error() != tt.err):
				t.Errorf("Check: %v, want %q", err, tt.err)
			case tt.err == "" && err != nil:
				t.Errorf("Check: %v", err)
			case tt.err == "" && c.keepLogBytes != tt.want:
				t.Errorf("keep %d bytes, want %d", c.keepLogBytes, tt.want)
			}
		})
	}
}

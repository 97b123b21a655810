package runner

import (
	"errors"
	"flag"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeSource has one string flag, --<name>-opt, and records its checks.
type fakeSource struct {
	name, summary string
	opt           string
	checked       *[]string
	refuse        error
}

func (f *fakeSource) Name() string    { return f.name }
func (f *fakeSource) Summary() string { return f.summary }
func (f *fakeSource) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.opt, f.name+"-opt", "", "")
}

func (f *fakeSource) Check(s Shared) error {
	*f.checked = append(*f.checked, f.name+" in "+s.Namespace)
	return f.refuse
}
func (f *fakeSource) Setup(Setup) error { return nil }

func TestSourcesChoose(t *testing.T) {
	t.Parallel()
	errRefused := errors.New("b-opt is wrong")
	tests := []struct {
		name        string
		args        []string
		source      string
		refuseB     error
		want        string // the chosen source's name, "" when refused
		wantErr     string
		wantChecked []string
	}{
		{name: "the source's own flag", args: []string{"--b-opt", "x"}, source: "b", want: "b", wantChecked: []string{"b in ns"}},
		{name: "no flag", source: "a", want: "a", wantChecked: []string{"a in ns"}},
		{name: "shared flag", args: []string{"--shared", "x"}, source: "a", want: "a", wantChecked: []string{"a in ns"}},
		{name: "unknown source", source: "d", wantErr: `--source "d": must be a, b or c`},
		{name: "its check fails", source: "b", refuseB: errRefused, wantErr: "b-opt is wrong", wantChecked: []string{"b in ns"}},
		{
			name: "another source's flag", args: []string{"--b-opt", "x"}, source: "a",
			wantErr: "--b-opt: need --source=b", wantChecked: []string{"a in ns"},
		},
		{
			name: "two other sources' flags", args: []string{"--c-opt", "x", "--b-opt", "y", "--a-opt", "z"}, source: "a",
			wantErr: "--b-opt: need --source=b; --c-opt: need --source=c", wantChecked: []string{"a in ns"},
		},
		{
			// Its own flags are checked first: the message says what is
			// wrong with the command line as meant.
			name: "its check fails and another's flag", args: []string{"--a-opt", "x"}, source: "b", refuseB: errRefused,
			wantErr: "b-opt is wrong", wantChecked: []string{"b in ns"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var checked []string
			b := &fakeSource{name: "b", summary: "B things", checked: &checked, refuse: tt.refuseB}
			s := NewSources(&fakeSource{name: "a", summary: "A things", checked: &checked}, b, &fakeSource{name: "c", summary: "C things", checked: &checked})
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			fs.String("shared", "", "")
			s.Bind(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := s.Choose(fs, tt.source, Shared{Namespace: "ns"})
			switch {
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
				t.Errorf("error %v, want %q", err, tt.wantErr)
			case tt.wantErr == "" && err != nil:
				t.Errorf("error %v", err)
			case tt.wantErr == "" && got.Name() != tt.want:
				t.Errorf("chose %s, want %s", got.Name(), tt.want)
			}
			if tt.refuseB != nil && !errors.Is(err, tt.refuseB) {
				t.Errorf("error %v does not wrap the check's", err)
			}
			if diff := cmp.Diff(tt.wantChecked, checked); diff != "" {
				t.Errorf("checked (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSourcesUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		sources     []Source
		wantUsage   string
		wantDefault string
	}{
		{name: "one", sources: []Source{&fakeSource{name: "a", summary: "A things"}}, wantUsage: "a (A things)", wantDefault: "a"},
		{
			name:        "two",
			sources:     []Source{&fakeSource{name: "kube", summary: "RunnerTask objects"}, &fakeSource{name: "orchestrator", summary: "a remote orchestrator over HTTPS"}},
			wantUsage:   "kube (RunnerTask objects) or orchestrator (a remote orchestrator over HTTPS)",
			wantDefault: "kube",
		},
		{
			name:        "three",
			sources:     []Source{&fakeSource{name: "a", summary: "A"}, &fakeSource{name: "b", summary: "B"}, &fakeSource{name: "c", summary: "C"}},
			wantUsage:   "a (A), b (B) or c (C)",
			wantDefault: "a",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := NewSources(tt.sources...)
			if got := s.Usage(); got != tt.wantUsage {
				t.Errorf("Usage = %q, want %q", got, tt.wantUsage)
			}
			if got := s.Default(); got != tt.wantDefault {
				t.Errorf("Default = %q, want %q", got, tt.wantDefault)
			}
		})
	}
}

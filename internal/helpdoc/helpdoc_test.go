package helpdoc

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestMissing(t *testing.T) {
	t.Parallel()
	help := "Usage of x:\n  -kubeconfig string\n    \tthe kubeconfig\n  -v\tverbose\n  -max-concurrent int\n  -q\tquiet\n"
	doc := filepath.Join(t.TempDir(), "x.md")
	if err := os.WriteFile(doc, []byte("Run with `--kubeconfig FILE` and `--max-concurrent-tasks N`; `-q` is quiet, `--version` prints it."), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Flags(help); !slices.Equal(got, []string{"kubeconfig", "v", "max-concurrent", "q"}) {
		t.Errorf("Flags = %v", got)
	}
	got, err := Missing(help, doc)
	if err != nil {
		t.Fatal(err)
	}
	// --max-concurrent-tasks is another flag, not a mention of
	// --max-concurrent; --version is not -v.
	if want := []string{"v", "max-concurrent"}; !slices.Equal(got, want) {
		t.Errorf("Missing = %v, want %v", got, want)
	}
}

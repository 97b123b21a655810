package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTrustedCAs(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := TrustedCAs(empty, "gitea"); err == nil || !strings.Contains(err.Error(), "gitea CA bundle "+empty+": no PEM certificate in it") {
		t.Errorf("a bundle without a certificate: %v", err)
	}
	if _, err := TrustedCAs(filepath.Join(dir, "absent.pem"), "orchestrator"); err == nil || !strings.Contains(err.Error(), "reading the orchestrator CA bundle") {
		t.Errorf("an absent bundle: %v", err)
	}
}

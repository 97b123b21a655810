package cert

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestEnsureMakesAndRotatesCertificates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	m, err := New(Options{Dir: dir, Hosts: []string{"127.0.0.1", "runwarden-webhook.runwarden.svc"}, Validity: 30 * 24 * time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := read(t, dir, CertFile)
	verify(t, dir, m.CABundle(), "runwarden-webhook.runwarden.svc")
	verify(t, dir, m.CABundle(), "127.0.0.1")

	// Still valid: nothing changes.
	now = now.Add(10 * 24 * time.Hour)
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if string(read(t, dir, CertFile)) != string(first) {
		t.Error("a valid certificate was replaced")
	}

	// Within a third of the validity of expiry: rotated, and the bundle holds
	// the new CA and the previous one.
	now = now.Add(11 * 24 * time.Hour)
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	if string(read(t, dir, CertFile)) == string(first) {
		t.Fatal("the certificate was not rotated before expiry")
	}
	pool := x509.NewCertPool()
	if n := countCerts(m.CABundle()); n != 2 || !pool.AppendCertsFromPEM(m.CABundle()) {
		t.Errorf("bundle after rotation holds %d certificates, want the new CA and the previous one", n)
	}
	verify(t, dir, m.CABundle(), "127.0.0.1")
}

func read(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func verify(t *testing.T, dir string, bundle []byte, host string) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatalf("key pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, CurrentTime: leaf.NotBefore.Add(2 * time.Hour)}); err != nil {
		t.Errorf("certificate does not verify for %s against the bundle: %v", host, err)
	}
}

func countCerts(b []byte) int {
	return bytes.Count(b, []byte("-----BEGIN CERTIFICATE-----"))
}

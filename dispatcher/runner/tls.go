package runner

import (
	"crypto/x509"
	"fmt"
	"os"
)

// TrustedCAs is the system's CA pool with the PEM bundle in file added:
// the CAs a source trusts for its tasks' origin besides the system's
// (--orchestrator-ca, --gitea-ca). what names the origin in errors.
func TrustedCAs(file, what string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the %s CA bundle: %w", what, err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s CA bundle %s: no PEM certificate in it", what, file)
	}
	return pool, nil
}

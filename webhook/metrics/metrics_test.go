package metrics

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A policy that names rules from its input cannot grow the denials metric
// past maxRules label values; malformed names count as "other".
func TestDenialRuleLabelsAreBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg)
	for i := range 1000 {
		r.Denial(fmt.Sprintf("quota-team-%d", i))
	}
	r.Denial("Not Kebab")
	r.Denial("quota-team-0")
	counts := denials(t, reg)
	if len(counts) != maxRules+1 {
		t.Errorf("%d rule label values, want %d and other", len(counts), maxRules)
	}
	if got, want := counts["other"], float64(1000-maxRules+1); got != want {
		t.Errorf("other = %v, want %v", got, want)
	}
	if got := counts["quota-team-0"]; got != 2 {
		t.Errorf("a known rule counts on: quota-team-0 = %v, want 2", got)
	}
}

func denials(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "runwarden_webhook_denials_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "rule" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// The serving certificate's expiry is read from its file at each scrape,
// so a rotated certificate shows at once; NaN while there is none.
func TestCertificateExpiry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r := New(reg)
	path := filepath.Join(t.TempDir(), "tls.crt")
	if err := r.WatchCertificate(path); err != nil {
		t.Fatal(err)
	}
	expiry := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "runwarden_webhook_certificate_expiry_timestamp_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no certificate expiry metric")
		return 0
	}
	if v := expiry(); !math.IsNaN(v) {
		t.Errorf("expiry %v without a certificate, want NaN", v)
	}
	for _, days := range []int{30, 90} {
		notAfter := time.Now().Add(time.Duration(days) * 24 * time.Hour).Truncate(time.Second)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: notAfter}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		if v := expiry(); v != float64(notAfter.Unix()) {
			t.Errorf("expiry %v, want %d", v, notAfter.Unix())
		}
	}
}

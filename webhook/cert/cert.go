// Package cert keeps the webhook's serving certificate: it generates a CA
// and a serving certificate signed by it, writes them where the webhook
// server reads them, keeps the caBundle of the webhook configurations
// current, and rotates both well before they expire, without a restart.
//
// Every webhook pod has its own CA (the certificate folder is an emptyDir),
// and several pods run at once during a rolling update or with more than
// one replica. So a pod never replaces the caBundle: it adds its CA to it
// and keeps the other pods' CAs until they expire.
package cert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// File names in the certificate folder, as controller-runtime's webhook
// server expects them.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// MaxBundle bounds the CA certificates a caBundle keeps: this pod's and
// every proven live pod's (see AnnotationCAPrefix) always, then the newest
// of the others up to MaxBundle in all. Pods that were replaced leave their
// CA behind until it expires; the bound keeps a run of restarts from
// growing the bundle without bound, and never pushes out the CA of a pod
// that has served past its first check and still publishes.
const MaxBundle = 16

// AnnotationCAPrefix starts the annotations on each webhook configuration
// that record when a pod first and last published its CA: the key ends
// with the first 20 hex digits of the CA's SHA-256, the value is two RFC
// 3339 times, "first last". Every pod publishes at each check (Run: a
// minute after start, then hourly): a CA published again, last within
// LiveFor, is a live pod's, and stays in the bundle whatever other pods
// come and go. A pod that dies before its second check is not told from
// one still starting; those CAs, newest first, fill the rest.
const AnnotationCAPrefix = "ca.runwarden.dev/"

// Options configure a Manager.
type Options struct {
	// Dir is the folder the webhook server reads its certificate from. Required.
	Dir string
	// Hosts are the DNS names and IP addresses the certificate is valid for,
	// e.g. runwarden-webhook.runwarden.svc or 127.0.0.1. Required.
	Hosts []string
	// Validity is how long a certificate is valid. Default: 90 days.
	Validity time.Duration
	// RotateBefore is how long before expiry a new one is made. Default: a
	// third of Validity.
	RotateBefore time.Duration
	// Client updates the caBundle of the webhook configurations below.
	// Default: none (caBundle is left to the caller).
	Client client.Client
	// MutatingWebhooks and ValidatingWebhooks name the configurations whose
	// caBundle is kept current.
	MutatingWebhooks, ValidatingWebhooks []string
	// Now is the clock. Default: time.Now.
	Now func() time.Time
	// LiveFor is how long after a pod last published its CA the CA counts
	// as a live pod's, which the bundle always keeps. It must be well
	// above the interval given to Run. Default: 3h.
	LiveFor time.Duration
}

func (o *Options) setDefaults() {
	if o.LiveFor <= 0 {
		o.LiveFor = 3 * time.Hour
	}
	if o.Validity <= 0 {
		o.Validity = 90 * 24 * time.Hour
	}
	if o.RotateBefore <= 0 {
		o.RotateBefore = o.Validity / 3
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Manager generates, rotates and publishes the serving certificate.
type Manager struct {
	opts Options
	ca   []byte // PEM of the CA in force
}

// New returns a Manager.
func New(opts Options) (*Manager, error) {
	opts.setDefaults()
	if opts.Dir == "" || len(opts.Hosts) == 0 {
		return nil, errors.New("cert: Dir and Hosts are required")
	}
	return &Manager{opts: opts}, nil
}

// Ensure makes sure a valid certificate is in Dir, making a new CA and
// certificate when there is none or it expires within RotateBefore, and
// adds the CA to the caBundle of the webhook configurations, keeping the
// CAs of other webhook pods that are there until they expire.
//
// On rotation the new CA is published, together with the previous one,
// before the new certificate is served, so the API server trusts the
// serving certificate at every moment. Called again (Run does, hourly), it
// adds the CA back if it went missing.
func (m *Manager) Ensure(ctx context.Context) error {
	if m.valid() {
		ca, err := os.ReadFile(filepath.Join(m.opts.Dir, CAFile))
		if err != nil {
			return fmt.Errorf("cert: reading the CA: %w", err)
		}
		m.ca = ca
		return m.publish(ctx)
	}
	newCA, key, crt, err := m.generate()
	if err != nil {
		return err
	}
	bundle := newCA
	if old, err := os.ReadFile(filepath.Join(m.opts.Dir, CAFile)); err == nil {
		if first, _ := pem.Decode(old); first != nil {
			bundle = append(append([]byte{}, newCA...), pem.EncodeToMemory(first)...)
		}
	}
	if err := os.MkdirAll(m.opts.Dir, 0o700); err != nil {
		return fmt.Errorf("cert: %w", err)
	}
	if err := writeAtomic(filepath.Join(m.opts.Dir, CAFile), bundle); err != nil {
		return err
	}
	m.ca = bundle
	if err := m.publish(ctx); err != nil {
		return err
	}
	// The key before the certificate, so the server's file watcher never
	// pairs a new certificate with an old key.
	if err := writeAtomic(filepath.Join(m.opts.Dir, KeyFile), key); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(m.opts.Dir, CertFile), crt)
}

// CABundle returns the PEM of this pod's CA in force (and, after a
// rotation, the previous one); the published caBundle may hold more.
func (m *Manager) CABundle() []byte { return m.ca }

// Run calls Ensure a minute after it starts (or after interval, if
// shorter), then every interval, until ctx ends. The early call is the
// pod's second publication, which marks its CA as a live pod's.
func (m *Manager) Run(ctx context.Context, interval time.Duration) error {
	log := logr.FromContextOrDiscard(ctx)
	t := time.NewTimer(min(time.Minute, interval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := m.Ensure(ctx); err != nil {
				log.Error(err, "keeping the serving certificate current")
			}
			t.Reset(interval)
		}
	}
}

// valid reports whether Dir holds a certificate for all Hosts that does not
// expire within RotateBefore.
func (m *Manager) valid() bool {
	b, err := os.ReadFile(filepath.Join(m.opts.Dir, CertFile))
	if err != nil {
		return false
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return false
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}
	if m.opts.Now().Add(m.opts.RotateBefore).After(c.NotAfter) {
		return false
	}
	for _, h := range m.opts.Hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// generate makes a new CA and a serving certificate; it returns their PEM.
func (m *Manager) generate() (ca, key, crt []byte, err error) {
	now := m.opts.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cert: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "runwarden-webhook-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(m.opts.Validity + m.opts.Validity/2),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cert: making the CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cert: %w", err)
	}
	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cert: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: m.opts.Hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(m.opts.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range m.opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &servingKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cert: making the serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(servingKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cert: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("cert: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("cert: %w", err)
	}
	return nil
}

// publish merges the CA into the caBundle of every webhook of the
// configured webhook configurations, where that changes it.
func (m *Manager) publish(ctx context.Context) error {
	if m.opts.Client == nil {
		return nil
	}
	for _, name := range m.opts.MutatingWebhooks {
		if err := m.patchBundle(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{}, name); err != nil {
			return err
		}
	}
	for _, name := range m.opts.ValidatingWebhooks {
		if err := m.patchBundle(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{}, name); err != nil {
			return err
		}
	}
	return nil
}

// patchBundle merges this pod's CA into the caBundle of every client config
// of one webhook configuration, patching it only where that changes it.
// The patch carries the resourceVersion it was made from, so two pods
// publishing at once cannot drop each other's CA: the later one gets a
// conflict, reads again and merges again.
func (m *Manager) patchBundle(ctx context.Context, obj client.Object, name string) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		if err := m.opts.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			return fmt.Errorf("reading %T %s: %w", obj, name, err)
		}
		patch := client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
		now := m.opts.Now()
		live := liveCAs(obj.GetAnnotations(), now, m.opts.LiveFor)
		own := parseCerts(m.ca)
		if len(own) == 0 {
			return errors.New("this pod's CA does not parse")
		}
		first := now
		if f, _, ok := caSeen(obj.GetAnnotations()[caKey(own[0])]); ok {
			first = f
		}
		kept := map[string]bool{}
		for _, cc := range clientConfigs(obj) {
			merged, err := mergeBundle(cc.CABundle, m.ca, now, live)
			if err != nil {
				return err
			}
			cc.CABundle = merged
			for _, c := range parseCerts(merged) {
				kept[caKey(c)] = true
			}
		}
		// This pod's CA is seen now; CAs no longer in any bundle are
		// forgotten.
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		for k := range ann {
			if strings.HasPrefix(k, AnnotationCAPrefix) && !kept[k] {
				delete(ann, k)
			}
		}
		ann[caKey(own[0])] = first.UTC().Format(time.RFC3339) + " " + now.UTC().Format(time.RFC3339)
		obj.SetAnnotations(ann)
		return m.opts.Client.Patch(ctx, obj, patch)
	})
	if err != nil {
		return fmt.Errorf("cert: updating the caBundle of %s: %w", name, err)
	}
	return nil
}

// mergeBundle returns the caBundle that holds own (this pod's CA, then
// possibly its previous one) and every certificate of published that is
// still valid at now, without duplicates: own's first certificate and the
// live ones (by caKey) always, then the newest of the others up to
// MaxBundle in all. Blocks that are not certificates, or do not parse, are
// dropped. The result is in a fixed order (newest first), so pods that see
// the same certificates write the same bytes.
func mergeBundle(published, own []byte, now time.Time, live map[string]bool) ([]byte, error) {
	mine := parseCerts(own)
	if len(mine) == 0 {
		return nil, errors.New("this pod's CA does not parse")
	}
	keep := []*x509.Certificate{mine[0]}
	seen := map[string]bool{string(mine[0].Raw): true}
	var rest []*x509.Certificate
	for _, c := range slices.Concat(mine[1:], parseCerts(published)) {
		if seen[string(c.Raw)] || now.After(c.NotAfter) {
			continue
		}
		seen[string(c.Raw)] = true
		if live[caKey(c)] {
			keep = append(keep, c)
		} else {
			rest = append(rest, c)
		}
	}
	slices.SortFunc(rest, newestFirst)
	if room := max(MaxBundle-len(keep), 0); len(rest) > room {
		rest = rest[:room]
	}
	rest = append(rest, keep...)
	slices.SortFunc(rest, newestFirst)
	var out []byte
	for _, c := range rest {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out, nil
}

// caKey is the annotation that records when c was last published.
func caKey(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return AnnotationCAPrefix + hex.EncodeToString(sum[:10])
}

// liveCAs returns the caKeys of the CAs published at two checks or more,
// the last within liveFor of now.
func liveCAs(ann map[string]string, now time.Time, liveFor time.Duration) map[string]bool {
	live := map[string]bool{}
	for k, v := range ann {
		if !strings.HasPrefix(k, AnnotationCAPrefix) {
			continue
		}
		if first, last, ok := caSeen(v); ok && last.After(first) && now.Sub(last) <= liveFor {
			live[k] = true
		}
	}
	return live
}

// caSeen reads a CA annotation's "first last" times.
func caSeen(v string) (first, last time.Time, ok bool) {
	a, b, found := strings.Cut(v, " ")
	if !found {
		return first, last, false
	}
	first, err1 := time.Parse(time.RFC3339, a)
	last, err2 := time.Parse(time.RFC3339, b)
	return first, last, err1 == nil && err2 == nil
}

// parseCerts returns the certificates of a PEM bundle, skipping blocks that
// are not certificates or do not parse.
func parseCerts(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// newestFirst orders certificates by NotBefore, latest first, then by their
// bytes.
func newestFirst(a, b *x509.Certificate) int {
	if c := b.NotBefore.Compare(a.NotBefore); c != 0 {
		return c
	}
	return bytes.Compare(a.Raw, b.Raw)
}

// clientConfigs returns the client configs of a webhook configuration.
func clientConfigs(obj client.Object) []*admissionregistrationv1.WebhookClientConfig {
	var out []*admissionregistrationv1.WebhookClientConfig
	switch cfg := obj.(type) {
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range cfg.Webhooks {
			out = append(out, &cfg.Webhooks[i].ClientConfig)
		}
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range cfg.Webhooks {
			out = append(out, &cfg.Webhooks[i].ClientConfig)
		}
	}
	return out
}

package cert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
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

const host = "runwarden-webhook.runwarden.svc"

// configurations returns a fake client holding a mutating and a validating
// webhook configuration named runwarden, with two webhooks each.
func configurations(t *testing.T, bundle []byte) client.WithWatch {
	t.Helper()
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: bundle}
	return fake.NewClientBuilder().WithObjects(
		&admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "runwarden"},
			Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "a.runwarden.dev", ClientConfig: cc}, {Name: "b.runwarden.dev", ClientConfig: cc}},
		},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "runwarden"},
			Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "a.runwarden.dev", ClientConfig: cc}, {Name: "b.runwarden.dev", ClientConfig: cc}},
		},
	).Build()
}

// bundles returns the caBundle of every webhook of the configurations.
func bundles(t *testing.T, c client.Client) [][]byte {
	t.Helper()
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: "runwarden"}, mwc); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(t.Context(), client.ObjectKey{Name: "runwarden"}, vwc); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, cc := range slices.Concat(clientConfigs(mwc), clientConfigs(vwc)) {
		out = append(out, cc.CABundle)
	}
	return out
}

func newManager(t *testing.T, c client.Client, now *time.Time) (*Manager, string) {
	t.Helper()
	dir := t.TempDir()
	m, err := New(Options{
		Dir: dir, Hosts: []string{host}, Validity: 30 * 24 * time.Hour, Client: c,
		MutatingWebhooks: []string{"runwarden"}, ValidatingWebhooks: []string{"runwarden"},
		Now: func() time.Time { return *now },
	})
	if err != nil {
		t.Fatal(err)
	}
	return m, dir
}

// TestPodsSharingTheConfigurationsAreAllTrusted runs two webhook pods, each
// with its own CA, against one set of webhook configurations, as during a
// rolling update: the published bundle must trust both pods' certificates,
// before and after one of them rotates.
func TestPodsSharingTheConfigurationsAreAllTrusted(t *testing.T) {
	t.Parallel()
	c := configurations(t, nil)
	nowA := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	nowB := nowA.Add(time.Minute)
	a, dirA := newManager(t, c, &nowA)
	b, dirB := newManager(t, c, &nowB)
	check := func(round string) {
		t.Helper()
		for i, bundle := range bundles(t, c) {
			for name, dir := range map[string]string{"pod a": dirA, "pod b": dirB} {
				t.Run(fmt.Sprintf("%s/webhook %d/%s", round, i, name), func(t *testing.T) { verify(t, dir, bundle, host) })
			}
		}
	}

	ensure := func(m *Manager) {
		t.Helper()
		if err := m.Ensure(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	// Both pods start; then each publishes again, as Run does hourly.
	ensure(a)
	ensure(b)
	check("start")
	if n := countCerts(bundles(t, c)[0]); n != 2 {
		t.Errorf("bundle holds %d certificates, want the two pods' CAs", n)
	}
	ensure(a)
	check("second round, a")
	ensure(b)
	check("second round, b")

	// Each rotates in turn; the other's CA stays throughout.
	nowA = nowA.Add(21 * 24 * time.Hour)
	before := read(t, dirA, CertFile)
	ensure(a)
	if bytes.Equal(read(t, dirA, CertFile), before) {
		t.Fatal("pod a did not rotate")
	}
	check("a rotated")
	nowB = nowA
	ensure(b)
	check("b rotated")
}

func TestBundleDropsExpiredCAsAndIsCapped(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	// An old pod's CA, long expired (CAs live 1.5 times Validity).
	then := now.Add(-100 * 24 * time.Hour)
	old, _ := newManager(t, nil, &then)
	if err := old.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	garbage := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})
	key := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte("x")})
	var others []byte
	for range MaxBundle + 4 {
		o, _ := newManager(t, nil, &now)
		if err := o.Ensure(t.Context()); err != nil {
			t.Fatal(err)
		}
		others = append(others, o.CABundle()...)
	}

	c := configurations(t, slices.Concat(old.CABundle(), garbage, key))
	m, _ := newManager(t, c, &now)
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, bundle := range bundles(t, c) {
		if !bytes.Equal(bundle, m.CABundle()) {
			t.Errorf("bundle holds %d certificates, want only the pod's own CA: the old CA is expired, the rest not certificates", countCerts(bundle))
		}
	}

	c = configurations(t, others)
	m, dir := newManager(t, c, &now)
	if err := m.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, bundle := range bundles(t, c) {
		if n := countCerts(bundle); n != MaxBundle {
			t.Errorf("bundle holds %d certificates, want %d", n, MaxBundle)
		}
		verify(t, dir, bundle, host)
	}
}

// TestConcurrentPublishesKeepBothCAs has pod b publish between pod a's read
// and its patch: a's patch must not drop b's CA.
func TestConcurrentPublishesKeepBothCAs(t *testing.T) {
	t.Parallel()
	c := configurations(t, nil)
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	b, dirB := newManager(t, c, &now)
	raced := false
	racing := interceptor.NewClient(c, interceptor.Funcs{
		Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if !raced {
				raced = true
				if err := b.Ensure(ctx); err != nil {
					return err
				}
			}
			return cl.Patch(ctx, obj, patch, opts...)
		},
	})
	a, dirA := newManager(t, racing, &now)
	if err := a.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, bundle := range bundles(t, c) {
		verify(t, dirA, bundle, host)
		verify(t, dirB, bundle, host)
	}
}

// TestLivePodsCAStaysThroughRestarts: one pod lives on while more than
// MaxBundle others start, publish once and are replaced (many rolling
// updates, evictions). The live pod's CA (published at two checks) stays
// in every bundle, which the API server must trust to call it; the bundle
// stays bounded; once the live pod stops publishing (it is gone), its CA
// may go.
func TestLivePodsCAStaysThroughRestarts(t *testing.T) {
	t.Parallel()
	c := configurations(t, nil)
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	live, dir := newManager(t, c, &now)
	for range 2 { // at start, and at its first check a minute later
		if err := live.Ensure(t.Context()); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Minute)
	}
	restart := func(n int) {
		for range n {
			now = now.Add(time.Minute)
			p, _ := newManager(t, c, &now)
			if err := p.Ensure(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	restart(MaxBundle + 4)
	for _, bundle := range bundles(t, c) {
		if n := countCerts(bundle); n > MaxBundle {
			t.Errorf("bundle holds %d certificates, more than %d", n, MaxBundle)
		}
		verify(t, dir, bundle, host)
	}
	// The live pod publishes at its hourly check; more restarts follow.
	now = now.Add(30 * time.Minute)
	if err := live.Ensure(t.Context()); err != nil {
		t.Fatal(err)
	}
	restart(MaxBundle + 4)
	for _, bundle := range bundles(t, c) {
		verify(t, dir, bundle, host)
	}
	// Gone: no publication for longer than LiveFor; newer CAs push it out.
	now = now.Add(4 * time.Hour)
	restart(MaxBundle)
	pool := x509.NewCertPool()
	for _, bundle := range bundles(t, c) {
		if n := countCerts(bundle); n != MaxBundle {
			t.Errorf("bundle holds %d certificates, want %d", n, MaxBundle)
		}
		pool.AppendCertsFromPEM(bundle)
	}
	if own := parseCerts(live.CABundle()); len(own) == 0 || slices.ContainsFunc(parseCerts(bytes.Join(bundles(t, c), nil)), own[0].Equal) {
		t.Error("the CA of a pod gone for more than LiveFor is still in the bundle")
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: "runwarden"}, mwc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for k := range mwc.Annotations {
		if strings.HasPrefix(k, AnnotationCAPrefix) {
			n++
		}
	}
	if n != MaxBundle {
		t.Errorf("%d CA annotations, want one for each of the %d CAs kept", n, MaxBundle)
	}
}

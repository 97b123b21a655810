package main

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"
)

// archive writes an image for arch to a `docker save` archive, as
// hack/image does, and returns its path and digest.
func archive(t *testing.T, arch string) (string, v1.Hash) {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), arch+".tar")
	ref, err := name.NewTag("localhost/runwarden/test:" + arch)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, ref, img); err != nil {
		t.Fatal(err)
	}
	// The digest of the image as read back, which is what gets pushed.
	back, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := back.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return p, d
}

func TestPushIndexPushesEveryPlatform(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	amd, amdDigest := archive(t, "amd64")
	arm, armDigest := archive(t, "arm64")
	tag, err := name.NewTag(host+"/runwarden/webhook:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	platforms := []Platform{{"linux", "amd64", amd}, {"linux", "arm64", arm}}
	pushed, err := PushIndex(context.Background(), tag, platforms)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"linux/amd64": amdDigest.String(), "linux/arm64": armDigest.String()}
	if diff := cmp.Diff(want, pushed.Platforms); diff != "" {
		t.Errorf("platform digests (-want +got):\n%s", diff)
	}
	// The registry serves the index under the tag, with both platforms'
	// images pullable by their digests.
	idx, err := remote.Index(tag)
	if err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil || d.String() != pushed.Digest {
		t.Fatalf("the tag's index digest %v (%v), want %s", d, err, pushed.Digest)
	}
	for plat, digest := range want {
		if _, err := remote.Image(tag.Context().Digest(digest)); err != nil {
			t.Errorf("%s image %s: %v", plat, digest, err)
		}
	}
	// The same archives give the same index: a second push changes nothing.
	again, err := PushIndex(context.Background(), tag, platforms)
	if err != nil || again.Digest != pushed.Digest {
		t.Errorf("second push: digest %s (%v), want %s", again.Digest, err, pushed.Digest)
	}
}

func TestIndexRefusesAWrongPlatform(t *testing.T) {
	t.Parallel()
	amd, _ := archive(t, "amd64")
	if _, err := Index([]Platform{{"linux", "arm64", amd}}); err == nil || !strings.Contains(err.Error(), "not linux/arm64") {
		t.Errorf("an amd64 image given as linux/arm64: err = %v, want a refusal", err)
	}
	if _, err := Index([]Platform{{"linux", "amd64", amd}, {"linux", "amd64", amd}}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a platform given twice: err = %v, want a refusal", err)
	}
}

func TestPushIndexCmdChecksItsArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"push-index", "--image", "linux/amd64=a.tar"},
		{"push-index", "--ref", "localhost:5000/x:v1"},
		{"push-index", "--ref", "localhost:5000/x:v1", "--image", "amd64=a.tar"},
		{"push-index", "--ref", "localhost:5000/x@sha256:" + strings.Repeat("0", 64), "--image", "linux/amd64=a.tar"},
		{"chart-values", "--file", "v.yaml", "--registry", "r"},
		{"chart-values", "--file", "v.yaml", "--registry", "r", "--tag", "t", "--digest", "webhook=latest"},
		{"nonsense"},
	} {
		var stderr strings.Builder
		if code := run(context.Background(), args, &strings.Builder{}, &stderr); code != 2 {
			t.Errorf("release %s: exit %d, want 2 (stderr %q)", strings.Join(args, " "), code, stderr.String())
		}
	}
}

func TestSetImagesChangesOnlyTheImages(t *testing.T) {
	t.Parallel()
	in, err := os.ReadFile(filepath.Join("..", "..", "charts", "runwarden", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	out, err := SetImages(in, Images{Registry: "localhost:5000/runwarden", Tag: "v0.2.0", Digests: map[string]string{"webhook": digest, "runner": digest}})
	if err != nil {
		t.Fatal(err)
	}
	var before, after map[string]any
	if err := yaml.Unmarshal(in, &before); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(out, &after); err != nil {
		t.Fatalf("the rewritten values do not parse: %v\n%s", err, out)
	}
	images := before["images"].(map[string]any)
	images["registry"], images["tag"], images["runnerTag"] = "localhost:5000/runwarden", "v0.2.0", ""
	images["digests"] = map[string]any{"webhook": digest, "runner": digest}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("values after SetImages (-want +got):\n%s", diff)
	}
	// Its comments stay: they document the values for whoever reads the
	// packaged chart.
	if !strings.Contains(string(out), "# Pin an image by digest instead of its tag") {
		t.Error("the comments of images.digests are gone")
	}
	if _, err := SetImages([]byte("a: 1\n"), Images{}); err == nil {
		t.Error("values without images: want an error")
	}
}

// The registry test server speaks plain HTTP; the ca-file path is checked
// on its own.
func TestTransportWithCA(t *testing.T) {
	t.Parallel()
	if _, err := transportWithCA(filepath.Join(t.TempDir(), "missing.crt")); err == nil {
		t.Error("a missing CA file: want an error")
	}
	bad := filepath.Join(t.TempDir(), "bad.crt")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := transportWithCA(bad); err == nil {
		t.Error("a CA file without a certificate: want an error")
	}
	srv := httptest.NewTLSServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pemOf(srv.Certificate().Raw), 0o600); err != nil {
		t.Fatal(err)
	}
	tr, err := transportWithCA(ca)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.URL)
	tag, err := name.NewTag(u.Host + "/runwarden/x:v1")
	if err != nil {
		t.Fatal(err)
	}
	img, _ := random.Image(16, 1)
	if err := remote.Write(tag, img, remote.WithTransport(tr)); err != nil {
		t.Errorf("push over TLS trusting the server's CA: %v", err)
	}
	if err := remote.Write(tag, img); err == nil {
		t.Error("push over TLS without trusting the CA: want a certificate error")
	}
}

func pemOf(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// Command release is the part of `make release` (hack/release.sh) that talks
// to the registry and edits the chart: it pushes one image's per-platform
// archives (hack/image) as a multi-platform index, and writes the released
// image references and digests into a copy of the chart's values.yaml.
//
//	go run ./hack/release push-index --ref localhost:5000/runwarden/webhook:v0.2.0 \
//	    --ca-file ca.crt --image linux/amd64=webhook-amd64.tar --image linux/arm64=webhook-arm64.tar
//	go run ./hack/release chart-values --file chart/values.yaml --registry localhost:5000/runwarden \
//	    --tag v0.2.0 --digest webhook=sha256:...
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: release push-index --ref REF --image OS/ARCH=ARCHIVE... [--ca-file FILE]
       release chart-values --file VALUES --registry REGISTRY --tag TAG [--runner-tag TAG] [--digest KEY=DIGEST...]`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "push-index":
		err = pushIndexCmd(ctx, args[1:], stdout, stderr)
	case "chart-values":
		err = chartValuesCmd(args[1:], stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		err = usageError{fmt.Errorf("unknown command %q\n%s", args[0], usage)}
	}
	var uerr usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &uerr):
		fmt.Fprintln(stderr, "release:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "release:", err)
		return 1
	}
}

// usageError is a mistake on the command line (exit code 2).
type usageError struct{ error }

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// Pushed is what push-index prints, as one JSON object: the index's
// reference and digest, and each platform image's digest.
type Pushed struct {
	Ref       string            `json:"ref"`
	Digest    string            `json:"digest"`
	Platforms map[string]string `json:"platforms"`
}

func pushIndexCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("push-index", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ref := fs.String("ref", "", "the index's reference, REGISTRY/REPOSITORY:TAG (required)")
	caFile := fs.String("ca-file", "", "PEM CA certificate to trust beside the system's, for a registry with a private CA")
	var images listFlag
	fs.Var(&images, "image", "OS/ARCH=ARCHIVE: one platform's image, an archive written by hack/image (repeatable, at least one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" || len(images) == 0 {
		return usageError{errors.New("push-index: --ref and at least one --image are required")}
	}
	tag, err := name.NewTag(*ref, name.StrictValidation)
	if err != nil {
		return usageError{fmt.Errorf("push-index: --ref %q: %w", *ref, err)}
	}
	platforms := make([]Platform, 0, len(images))
	for _, im := range images {
		p, err := parsePlatformImage(im)
		if err != nil {
			return usageError{fmt.Errorf("push-index: %w", err)}
		}
		platforms = append(platforms, p)
	}
	transport, err := transportWithCA(*caFile)
	if err != nil {
		return err
	}
	pushed, err := PushIndex(ctx, tag, platforms, remote.WithTransport(transport), remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(pushed)
}

// Platform is one platform's image archive.
type Platform struct {
	OS, Arch, Archive string
}

func parsePlatformImage(s string) (Platform, error) {
	plat, archive, ok := strings.Cut(s, "=")
	osName, arch, ok2 := strings.Cut(plat, "/")
	if !ok || !ok2 || osName == "" || arch == "" || archive == "" {
		return Platform{}, fmt.Errorf("--image %q: want OS/ARCH=ARCHIVE, e.g. linux/arm64=webhook.tar", s)
	}
	return Platform{OS: osName, Arch: arch, Archive: archive}, nil
}

// Index builds the multi-platform index of the archives, in the order given.
// The platform recorded for each must be its image's own.
func Index(platforms []Platform) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.DockerManifestList)
	seen := map[string]bool{}
	for _, p := range platforms {
		key := p.OS + "/" + p.Arch
		if seen[key] {
			return nil, fmt.Errorf("platform %s is given twice", key)
		}
		seen[key] = true
		img, err := tarball.ImageFromPath(p.Archive, nil)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p.Archive, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p.Archive, err)
		}
		if cf.OS != p.OS || cf.Architecture != p.Arch {
			return nil, fmt.Errorf("%s is an image for %s/%s, not %s", p.Archive, cf.OS, cf.Architecture, key)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch}},
		})
	}
	return idx, nil
}

// PushIndex pushes every platform's image and then the index under tag.
func PushIndex(ctx context.Context, tag name.Tag, platforms []Platform, opts ...remote.Option) (Pushed, error) {
	idx, err := Index(platforms)
	if err != nil {
		return Pushed{}, err
	}
	opts = append(opts, remote.WithContext(ctx))
	if err := remote.WriteIndex(tag, idx, opts...); err != nil {
		return Pushed{}, fmt.Errorf("pushing %s: %w", tag, err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return Pushed{}, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return Pushed{}, err
	}
	out := Pushed{Ref: tag.String(), Digest: digest.String(), Platforms: map[string]string{}}
	for _, d := range m.Manifests {
		out.Platforms[d.Platform.OS+"/"+d.Platform.Architecture] = d.Digest.String()
	}
	return out, nil
}

// transportWithCA is the default transport, trusting caFile beside the
// system's CAs when it is set.
func transportWithCA(caFile string) (http.RoundTripper, error) {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	if caFile == "" {
		return t, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", caFile)
	}
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t, nil
}

func chartValuesCmd(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("chart-values", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "the chart's values.yaml to rewrite in place (required)")
	registry := fs.String("registry", "", "images.registry: where the released images are, e.g. ghcr.io/runwarden (required)")
	tag := fs.String("tag", "", "images.tag: the released images' tag (required)")
	runnerTag := fs.String("runner-tag", "", "images.runnerTag, when the runner image's tag differs")
	var digests listFlag
	fs.Var(&digests, "digest", "KEY=sha256:...: images.digests.KEY, pinning that image by digest (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *file == "" || *registry == "" || *tag == "" {
		return usageError{errors.New("chart-values: --file, --registry and --tag are required")}
	}
	d := map[string]string{}
	for _, kv := range digests {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || !strings.HasPrefix(v, "sha256:") || len(v) != len("sha256:")+64 {
			return usageError{fmt.Errorf("chart-values: --digest %q: want KEY=sha256:<64 hex digits>", kv)}
		}
		d[k] = v
	}
	in, err := os.ReadFile(*file)
	if err != nil {
		return err
	}
	out, err := SetImages(in, Images{Registry: *registry, Tag: *tag, RunnerTag: *runnerTag, Digests: d})
	if err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	return os.WriteFile(*file, out, 0o644)
}

package resolve

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"strings"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
)

// GCP reads Secret Manager secret versions with Google's official Go client
// (its REST transport) and Application Default Credentials: the key file of
// the platform's Secret (GOOGLE_APPLICATION_CREDENTIALS), or GKE's metadata
// server under Workload Identity.
type GCP struct {
	client  *secretmanager.Client
	project string
}

// NewGCP makes the client; project (GOOGLE_CLOUD_PROJECT) completes a
// reference that names a secret only. opts add to it (a test's endpoint
// and token).
func NewGCP(ctx context.Context, project string, opts ...option.ClientOption) (*GCP, error) {
	c, err := secretmanager.NewRESTClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcp: %w", err)
	}
	return &GCP{client: c, project: project}, nil
}

// versionName is the full name of the secret version a reference reads:
// projects/<p>/secrets/<s>/versions/<v>, the latest version unless it names
// one.
func (g *GCP) versionName(id string) (string, error) {
	if !strings.HasPrefix(id, "projects/") {
		if g.project == "" {
			return "", fmt.Errorf("gcp: secret %s names no project, and none is configured (secretStores.gcp.project)", id)
		}
		id = "projects/" + g.project + "/secrets/" + id
	}
	if !strings.Contains(id, "/versions/") {
		id += "/versions/latest"
	}
	return id, nil
}

// Fetch reads the secret version's payload, checking its CRC32C.
func (g *GCP) Fetch(ctx context.Context, r Ref) (string, error) {
	name, err := g.versionName(r.Name)
	if err != nil {
		return "", err
	}
	resp, err := g.client.AccessSecretVersion(ctx, &secretmanagerpb.AccessSecretVersionRequest{Name: name})
	if err != nil {
		return "", fmt.Errorf("gcp: accessing %s: %w", name, classifyGCP(err))
	}
	p := resp.GetPayload()
	if p == nil {
		return "", fmt.Errorf("gcp: %s has no payload: %w", name, ErrNotFound)
	}
	if p.DataCrc32C != nil && int64(crc32.Checksum(p.GetData(), crc32.MakeTable(crc32.Castagnoli))) != p.GetDataCrc32C() {
		return "", fmt.Errorf("gcp: %s: the payload does not match its checksum", name)
	}
	return string(p.GetData()), nil
}

// classifyGCP wraps a client error with ErrNotFound, ErrDenied or
// ErrUnavailable.
func classifyGCP(err error) error {
	var ae *apierror.APIError
	if errors.As(err, &ae) {
		switch {
		case ae.GRPCStatus().Code() == codes.NotFound || ae.HTTPCode() == http.StatusNotFound:
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		case ae.GRPCStatus().Code() == codes.PermissionDenied || ae.GRPCStatus().Code() == codes.Unauthenticated ||
			ae.HTTPCode() == http.StatusForbidden || ae.HTTPCode() == http.StatusUnauthorized:
			return fmt.Errorf("%w: %w", ErrDenied, err)
		case ae.HTTPCode() == http.StatusTooManyRequests || ae.HTTPCode() >= 500 || ae.GRPCStatus().Code() == codes.Unavailable:
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

package resolve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/security/keyvault/azsecrets"
)

// Azure reads Key Vault secrets with Azure's official Go SDK and its
// default credential: the service principal of the platform's Secret
// (AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_TENANT_ID), or Azure Workload
// Identity's federated token.
type Azure struct {
	cred azcore.TokenCredential
	opts azsecrets.ClientOptions
	// url is a vault's address from its name.
	url func(vault string) string

	mu      sync.Mutex
	clients map[string]*azsecrets.Client
}

// NewAzure makes the store with Azure's default credential.
func NewAzure() (*Azure, error) {
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	if err != nil {
		return nil, fmt.Errorf("azure: %w", err)
	}
	return NewAzureWith(cred, azsecrets.ClientOptions{}, func(vault string) string { return "https://" + vault + ".vault.azure.net" }), nil
}

// NewAzureWith makes the store with a credential, client options and the
// address of a vault by name (a test's server).
func NewAzureWith(cred azcore.TokenCredential, opts azsecrets.ClientOptions, url func(vault string) string) *Azure {
	// Resolve tries again, bounded.
	opts.Retry.MaxRetries = -1
	return &Azure{cred: cred, opts: opts, url: url, clients: map[string]*azsecrets.Client{}}
}

func (a *Azure) client(vault string) (*azsecrets.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.clients[vault]; c != nil {
		return c, nil
	}
	c, err := azsecrets.NewClient(a.url(vault), a.cred, &a.opts)
	if err != nil {
		return nil, fmt.Errorf("azure: key vault %s: %w", vault, err)
	}
	a.clients[vault] = c
	return c, nil
}

// Fetch reads the current version of secret r.Name in key vault r.Vault.
func (a *Azure) Fetch(ctx context.Context, r Ref) (string, error) {
	c, err := a.client(r.Vault)
	if err != nil {
		return "", err
	}
	resp, err := c.GetSecret(ctx, r.Name, "", nil)
	if err != nil {
		return "", fmt.Errorf("azure: reading secret %s of key vault %s: %w", r.Name, r.Vault, classifyAzure(err))
	}
	if resp.Value == nil {
		return "", fmt.Errorf("azure: secret %s of key vault %s has no value: %w", r.Name, r.Vault, ErrNotFound)
	}
	return *resp.Value, nil
}

// classifyAzure wraps an SDK error with ErrNotFound, ErrDenied or
// ErrUnavailable.
func classifyAzure(err error) error {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		switch {
		case re.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		case re.StatusCode == http.StatusForbidden || re.StatusCode == http.StatusUnauthorized:
			return fmt.Errorf("%w: %w", ErrDenied, err)
		case re.StatusCode == http.StatusTooManyRequests || re.StatusCode >= 500:
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	var auth *azidentity.AuthenticationFailedError
	if errors.As(err, &auth) {
		return fmt.Errorf("%w: %w", ErrDenied, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

package resolve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/smithy-go"
)

// secretsManagerRef is the SSM path under which Parameter Store reads a
// Secrets Manager secret.
const secretsManagerRef = "/aws/reference/secretsmanager/"

// AWS reads SSM parameters, and Secrets Manager secrets through Parameter
// Store's reference path, with AWS's official Go SDK and its default
// credential chain: the static keys of the platform's Secret, or IRSA's web
// identity token.
type AWS struct {
	client *ssm.Client
}

// NewAWS makes the SSM client from the environment the policies give the
// init container (AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, or
// AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE). opts add to it (a test's
// endpoint and credentials).
func NewAWS(ctx context.Context, opts ...func(*config.LoadOptions) error) (*AWS, error) {
	// Resolve tries again, bounded.
	opts = append([]func(*config.LoadOptions) error{config.WithRetryMaxAttempts(1)}, opts...)
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("aws: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("aws: no region (AWS_REGION)")
	}
	return &AWS{client: ssm.NewFromConfig(cfg)}, nil
}

// Fetch reads the parameter r.Name (a Secrets Manager secret by its ARN or
// /aws/reference/secretsmanager/<name>), decrypted, and r.Key of its JSON
// value when the reference names one.
func (a *AWS) Fetch(ctx context.Context, r Ref) (string, error) {
	name := r.Name
	if strings.HasPrefix(name, "arn:") && strings.Contains(name, ":secretsmanager:") {
		name = secretsManagerRef + name
	}
	out, err := a.client.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name), WithDecryption: aws.Bool(true)})
	if err != nil {
		return "", fmt.Errorf("aws: reading parameter %s: %w", name, classifyAWS(err))
	}
	if out.Parameter == nil || out.Parameter.Value == nil {
		return "", fmt.Errorf("aws: parameter %s has no value: %w", name, ErrNotFound)
	}
	value := *out.Parameter.Value
	if r.Key == "" {
		return value, nil
	}
	var fields map[string]any
	if err := json.Unmarshal([]byte(value), &fields); err != nil {
		// Not the value itself: it may be the secret.
		return "", fmt.Errorf("aws: parameter %s is not a JSON object, so it has no key %q", name, r.Key)
	}
	v, ok := fields[r.Key]
	if !ok {
		return "", fmt.Errorf("aws: parameter %s has no JSON key %q: %w", name, r.Key, ErrNotFound)
	}
	return fieldText(v), nil
}

// classifyAWS wraps an SDK error with ErrNotFound, ErrDenied or
// ErrUnavailable.
func classifyAWS(err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ParameterNotFound", "ParameterVersionNotFound", "ResourceNotFoundException":
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException", "InvalidClientTokenId":
			return fmt.Errorf("%w: %w", ErrDenied, err)
		case "ThrottlingException", "InternalServerError":
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		if code := re.HTTPStatusCode(); code == http.StatusTooManyRequests || code >= 500 {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	if api != nil {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

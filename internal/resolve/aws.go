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
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/smithy-go"
)

// AWS reads SSM parameters, and Secrets Manager secrets, with AWS's official
// Go SDK and its default credential chain: the static keys of the platform's
// Secret, or IRSA's web identity token.
//
// ${ssm:<id>} names either: a Secrets Manager ARN is read from Secrets
// Manager itself (GetSecretValue, in the ARN's region), and anything else is
// an SSM parameter, Parameter Store's reference path
// /aws/reference/secretsmanager/<name> included (GetParameter, decrypted).
type AWS struct {
	ssm *ssm.Client
	sm  *secretsmanager.Client
}

// NewAWS makes the SSM and Secrets Manager clients from the environment the
// policies give the init container (AWS_REGION, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, or AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE).
// opts add to it (a test's endpoint and credentials).
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
	return &AWS{ssm: ssm.NewFromConfig(cfg), sm: secretsmanager.NewFromConfig(cfg)}, nil
}

// secretsManagerRegion returns the region of a Secrets Manager secret's ARN
// (arn:<partition>:secretsmanager:<region>:<account>:secret:<name>), and
// whether name is one.
func secretsManagerRegion(name string) (string, bool) {
	f := strings.SplitN(name, ":", 6)
	if len(f) < 6 || f[0] != "arn" || f[2] != "secretsmanager" {
		return "", false
	}
	return f[3], true
}

// Fetch reads the secret r.Name, and r.Key of its JSON value when the
// reference names one.
func (a *AWS) Fetch(ctx context.Context, r Ref) (string, error) {
	var value, what string
	var err error
	if region, ok := secretsManagerRegion(r.Name); ok {
		what = "secret " + r.Name
		value, err = a.secret(ctx, r.Name, region)
	} else {
		what = "parameter " + r.Name
		value, err = a.parameter(ctx, r.Name)
	}
	if err != nil || r.Key == "" {
		return value, err
	}
	var fields map[string]any
	if err := json.Unmarshal([]byte(value), &fields); err != nil {
		// Not the value itself: it may be the secret.
		return "", fmt.Errorf("aws: %s is not a JSON object, so it has no key %q", what, r.Key)
	}
	v, ok := fields[r.Key]
	if !ok {
		return "", fmt.Errorf("aws: %s has no JSON key %q: %w", what, r.Key, ErrNotFound)
	}
	return fieldText(v), nil
}

// parameter reads an SSM parameter, decrypted.
func (a *AWS) parameter(ctx context.Context, name string) (string, error) {
	out, err := a.ssm.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(name), WithDecryption: aws.Bool(true)})
	if err != nil {
		return "", fmt.Errorf("aws: reading parameter %s: %w", name, classifyAWS(err))
	}
	if out.Parameter == nil || out.Parameter.Value == nil {
		return "", fmt.Errorf("aws: parameter %s has no value: %w", name, ErrNotFound)
	}
	return *out.Parameter.Value, nil
}

// secret reads the current version (AWSCURRENT) of a Secrets Manager secret
// by its ARN, in the ARN's region (a secret is read in its own region).
func (a *AWS) secret(ctx context.Context, arn, region string) (string, error) {
	out, err := a.sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(arn)}, func(o *secretsmanager.Options) {
		if region != "" {
			o.Region = region
		}
	})
	if err != nil {
		return "", fmt.Errorf("aws: reading secret %s: %w", arn, classifyAWS(err))
	}
	if out.SecretString == nil {
		if out.SecretBinary != nil {
			return "", fmt.Errorf("aws: secret %s holds a binary value (SecretBinary); only a text value (SecretString) can be delivered", arn)
		}
		return "", fmt.Errorf("aws: secret %s has no value: %w", arn, ErrNotFound)
	}
	return *out.SecretString, nil
}

// classifyAWS wraps an SDK error with ErrNotFound, ErrDenied or
// ErrUnavailable.
func classifyAWS(err error) error {
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ParameterNotFound", "ParameterVersionNotFound", "ResourceNotFoundException":
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException", "InvalidClientTokenId",
			"DecryptionFailure":
			return fmt.Errorf("%w: %w", ErrDenied, err)
		case "ThrottlingException", "InternalServerError", "InternalServiceError":
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

package resolve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

const (
	awsKeyID  = "AKIDRUNWARDENTEST"
	awsSecret = "runwarden/test/secret/access/key"
	awsRegion = "eu-west-1"
)

// checkSigV4 verifies the request's Signature Version 4 signature with the
// known secret key, for service in region: the headers it names are signed
// again and the results compared. It returns why the request is not AWS's,
// or "".
func checkSigV4(r *http.Request, body []byte, service, region string) string {
	auth := r.Header.Get("Authorization")
	fields := map[string]string{}
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return "not a SigV4 Authorization header: " + auth
	}
	for _, f := range strings.Split(rest, ", ") {
		k, v, _ := strings.Cut(f, "=")
		fields[k] = v
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return "no X-Amz-Date"
	}
	scope := fmt.Sprintf("%s/%s/%s/%s/aws4_request", awsKeyID, when.Format("20060102"), region, service)
	if fields["Credential"] != scope {
		return fmt.Sprintf("credential scope %q, want %q", fields["Credential"], scope)
	}
	again, _ := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	again.Host, again.ContentLength = r.Host, int64(len(body))
	for _, h := range strings.Split(fields["SignedHeaders"], ";") {
		if h != "host" && h != "content-length" {
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	sum := sha256.Sum256(body)
	creds := aws.Credentials{AccessKeyID: awsKeyID, SecretAccessKey: awsSecret}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), service, region, when); err != nil {
		return err.Error()
	}
	if got := again.Header.Get("Authorization"); got != auth {
		return "signature mismatch"
	}
	return ""
}

// fakeAWS answers SSM's GetParameter, for the parameters given, and Secrets
// Manager's GetSecretValue, for the secrets given by ARN, as AWS does; it
// refuses a request that is not signed with the test's key for the
// service, in the store's region (SSM) or the secret's (Secrets Manager).
// seen records each request as "ssm <name>" or "secretsmanager <id>".
func fakeAWS(t *testing.T, params, secrets map[string]string, seen *[]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fail := func(code int, typ, msg string) {
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]string{"__type": typ, "message": msg})
		}
		target := r.Header.Get("X-Amz-Target")
		if r.Method != http.MethodPost || r.URL.Path != "/" || r.Header.Get("Content-Type") != "application/x-amz-json-1.1" ||
			(target != "AmazonSSM.GetParameter" && target != "secretsmanager.GetSecretValue") {
			fail(http.StatusBadRequest, "UnknownOperationException", fmt.Sprintf("%s %s %s", r.Method, r.URL.Path, target))
			return
		}
		var in struct {
			Name           string
			WithDecryption bool
			SecretId       string //nolint:revive // AWS's field name
			VersionStage   string
		}
		if err := json.Unmarshal(body, &in); err != nil {
			fail(http.StatusBadRequest, "ValidationException", err.Error())
			return
		}
		if target == "secretsmanager.GetSecretValue" {
			region := ""
			if f := strings.Split(in.SecretId, ":"); len(f) > 3 {
				region = f[3]
			}
			if why := checkSigV4(r, body, "secretsmanager", region); why != "" {
				fail(http.StatusBadRequest, "InvalidSignatureException", why)
				return
			}
			*seen = append(*seen, "secretsmanager "+in.SecretId)
			if strings.Contains(in.SecretId, "denied") {
				fail(http.StatusBadRequest, "AccessDeniedException", "User is not authorized to perform: secretsmanager:GetSecretValue")
				return
			}
			v, ok := secrets[in.SecretId]
			if !ok || (in.VersionStage != "" && in.VersionStage != "AWSCURRENT") {
				fail(http.StatusBadRequest, "ResourceNotFoundException", "Secrets Manager can't find the specified secret.")
				return
			}
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			_ = json.NewEncoder(w).Encode(map[string]any{"ARN": in.SecretId, "Name": "db", "SecretString": v, "VersionId": "v1", "VersionStages": []string{"AWSCURRENT"}})
			return
		}
		if why := checkSigV4(r, body, "ssm", awsRegion); why != "" {
			fail(http.StatusBadRequest, "InvalidSignatureException", why)
			return
		}
		if !in.WithDecryption {
			fail(http.StatusBadRequest, "ValidationException", "want WithDecryption")
			return
		}
		*seen = append(*seen, "ssm "+in.Name)
		if strings.Contains(in.Name, "denied") {
			fail(http.StatusBadRequest, "AccessDeniedException", "User is not authorized to perform: ssm:GetParameter")
			return
		}
		v, ok := params[in.Name]
		if !ok {
			fail(http.StatusBadRequest, "ParameterNotFound", "")
			return
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_ = json.NewEncoder(w).Encode(map[string]any{"Parameter": map[string]any{"Name": in.Name, "Type": "SecureString", "Value": v, "Version": 1}})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func newTestAWS(t *testing.T, url, secret string) *AWS {
	t.Helper()
	a, err := NewAWS(t.Context(), config.WithRegion(awsRegion), config.WithBaseEndpoint(url),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(awsKeyID, secret, "")))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Through AWS's own SDK against a server that checks what it sends (the
// operation, the signature and its region): SSM parameters, Parameter
// Store's reference path to Secrets Manager, Secrets Manager secrets by ARN
// read from Secrets Manager itself in the ARN's region, JSON keys, and
// failures classified.
func TestAWSParameterStore(t *testing.T) {
	t.Parallel()
	const (
		arn      = "arn:aws:secretsmanager:eu-west-1:111122223333:secret:db-AbCdEf"
		arnOther = "arn:aws:secretsmanager:us-west-2:111122223333:secret:api-GhIjKl"
		denied   = "arn:aws:secretsmanager:eu-west-1:111122223333:secret:denied-MnOpQr"
		refPath  = "/aws/reference/secretsmanager/db"
	)
	var seen []string
	srv := fakeAWS(t, map[string]string{
		"/team-a/db": "s3cr3t",
		refPath:      "via-ssm",
	}, map[string]string{
		arn:      `{"username":"app","password":"pa55","port":5432}`,
		arnOther: "t0ken",
	}, &seen)
	a := newTestAWS(t, srv.URL, awsSecret)
	for _, c := range []struct {
		ref  Ref
		want string
		err  error
		// asked is the request the server must have seen for it.
		asked string
	}{
		{Ref{Store: "ssm", Name: "/team-a/db"}, "s3cr3t", nil, "ssm /team-a/db"},
		{Ref{Store: "ssm", Name: refPath}, "via-ssm", nil, "ssm " + refPath},
		{Ref{Store: "ssm", Name: arn, Key: "password"}, "pa55", nil, "secretsmanager " + arn},
		{Ref{Store: "ssm", Name: arn, Key: "port"}, "5432", nil, "secretsmanager " + arn},
		{Ref{Store: "ssm", Name: arn, Key: "missing"}, "", ErrNotFound, "secretsmanager " + arn},
		{Ref{Store: "ssm", Name: arnOther}, "t0ken", nil, "secretsmanager " + arnOther},
		{Ref{Store: "ssm", Name: arn + "x"}, "", ErrNotFound, "secretsmanager " + arn + "x"},
		{Ref{Store: "ssm", Name: denied}, "", ErrDenied, "secretsmanager " + denied},
		{Ref{Store: "ssm", Name: "/team-a/none"}, "", ErrNotFound, "ssm /team-a/none"},
		{Ref{Store: "ssm", Name: "/team-a/denied"}, "", ErrDenied, "ssm /team-a/denied"},
	} {
		seen = nil
		got, err := a.Fetch(t.Context(), c.ref)
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("Fetch(%s#%s) = %q, %v; want %q, %v", c.ref.Name, c.ref.Key, got, err, c.want, c.err)
		}
		if err != nil && strings.Contains(err.Error(), "pa55") {
			t.Errorf("an error holds a value: %v", err)
		}
		if len(seen) != 1 || seen[0] != c.asked {
			t.Errorf("Fetch(%s#%s) asked %q, want %q", c.ref.Name, c.ref.Key, seen, c.asked)
		}
	}
	// A request signed with another key is refused by the server: the
	// signature is really checked.
	bad := newTestAWS(t, srv.URL, "another secret")
	for _, name := range []string{"/team-a/db", arn} {
		if _, err := bad.Fetch(t.Context(), Ref{Store: "ssm", Name: name}); !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "signature mismatch") {
			t.Errorf("a request for %s signed with the wrong key: %v, want refused for its signature", name, err)
		}
	}
}

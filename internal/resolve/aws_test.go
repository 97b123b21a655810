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
// known secret key: the headers it names are signed again and the results
// compared. It returns why the request is not AWS's, or "".
func checkSigV4(r *http.Request, body []byte, service string) string {
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
	scope := fmt.Sprintf("%s/%s/%s/%s/aws4_request", awsKeyID, when.Format("20060102"), awsRegion, service)
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
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), service, awsRegion, when); err != nil {
		return err.Error()
	}
	if got := again.Header.Get("Authorization"); got != auth {
		return "signature mismatch"
	}
	return ""
}

// fakeSSM answers GetParameter as SSM does, for the parameters given, and
// refuses a request that is not signed with the test's key.
func fakeSSM(t *testing.T, params map[string]string, seen *[]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fail := func(code int, typ, msg string) {
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(map[string]string{"__type": typ, "message": msg})
		}
		if r.Method != http.MethodPost || r.URL.Path != "/" || r.Header.Get("X-Amz-Target") != "AmazonSSM.GetParameter" || r.Header.Get("Content-Type") != "application/x-amz-json-1.1" {
			fail(http.StatusBadRequest, "UnknownOperationException", fmt.Sprintf("%s %s %s", r.Method, r.URL.Path, r.Header.Get("X-Amz-Target")))
			return
		}
		if why := checkSigV4(r, body, "ssm"); why != "" {
			fail(http.StatusBadRequest, "InvalidSignatureException", why)
			return
		}
		var in struct {
			Name           string
			WithDecryption bool
		}
		if err := json.Unmarshal(body, &in); err != nil || !in.WithDecryption {
			fail(http.StatusBadRequest, "ValidationException", "want WithDecryption")
			return
		}
		*seen = append(*seen, in.Name)
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
// operation, the signature): parameters, Secrets Manager secrets by ARN
// (through Parameter Store's reference path) with a JSON key, and failures
// classified.
func TestAWSParameterStore(t *testing.T) {
	t.Parallel()
	arn := "arn:aws:secretsmanager:eu-west-1:111122223333:secret:db-AbCdEf"
	var seen []string
	srv := fakeSSM(t, map[string]string{
		"/team-a/db":            "s3cr3t",
		secretsManagerRef + arn: `{"username":"app","password":"pa55","port":5432}`,
	}, &seen)
	a := newTestAWS(t, srv.URL, awsSecret)
	for _, c := range []struct {
		ref  Ref
		want string
		err  error
	}{
		{Ref{Store: "ssm", Name: "/team-a/db"}, "s3cr3t", nil},
		{Ref{Store: "ssm", Name: arn, Key: "password"}, "pa55", nil},
		{Ref{Store: "ssm", Name: arn, Key: "port"}, "5432", nil},
		{Ref{Store: "ssm", Name: arn, Key: "missing"}, "", ErrNotFound},
		{Ref{Store: "ssm", Name: "/team-a/none"}, "", ErrNotFound},
		{Ref{Store: "ssm", Name: "/team-a/denied"}, "", ErrDenied},
	} {
		got, err := a.Fetch(t.Context(), c.ref)
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("Fetch(%s#%s) = %q, %v; want %q, %v", c.ref.Name, c.ref.Key, got, err, c.want, c.err)
		}
		if err != nil && strings.Contains(err.Error(), "pa55") {
			t.Errorf("an error holds a value: %v", err)
		}
	}
	if seen[1] != secretsManagerRef+arn {
		t.Errorf("parameters asked for %q: a Secrets Manager ARN goes through %s", seen, secretsManagerRef)
	}
	// A request signed with another key is refused by the server: the
	// signature is really checked.
	bad := newTestAWS(t, srv.URL, "another secret")
	if _, err := bad.Fetch(t.Context(), Ref{Store: "ssm", Name: "/team-a/db"}); !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "signature mismatch") {
		t.Errorf("a request signed with the wrong key: %v, want refused for its signature", err)
	}
}

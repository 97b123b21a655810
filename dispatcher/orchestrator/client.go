package orchestrator

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/runwarden/runwarden/dispatcher/runner"
)

// Error is an error response from the orchestrator.
type Error struct {
	Status  int
	Code    string
	Message string
	// RetryAfter is the server's Retry-After, when it sent one.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	if e.Code != "" {
		return fmt.Sprintf("orchestrator: %d %s: %s", e.Status, e.Code, msg)
	}
	return fmt.Sprintf("orchestrator: %d: %s", e.Status, msg)
}

func statusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// notLeaseHolder tells whether the orchestrator refused a request because
// another dispatcher holds the lease it names (403 not-lease-holder).
func notLeaseHolder(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusForbidden && e.Code == CodeNotLeaseHolder
}

// IsGone tells whether a renewal found the lease gone (410), or held by
// another dispatcher (403 not-lease-holder): either way it is not this
// dispatcher's to renew.
func IsGone(err error) bool { return statusOf(err) == http.StatusGone || notLeaseHolder(err) }

// IsConflict tells whether the orchestrator refused a report as stale
// (409), or as sent by a dispatcher that does not hold the lease of its
// epoch (403 not-lease-holder): either way the lease is not this
// dispatcher's any more, and sending the report again cannot help.
func IsConflict(err error) bool {
	return statusOf(err) == http.StatusConflict || notLeaseHolder(err)
}

// IsFatal tells whether an error means the dispatcher cannot go on: it is
// not allowed (401, 403 but for not-lease-holder, which concerns one lease)
// or does not speak the orchestrator's protocol version (426).
func IsFatal(err error) bool {
	switch statusOf(err) {
	case http.StatusUnauthorized, http.StatusUpgradeRequired:
		return true
	case http.StatusForbidden:
		return !notLeaseHolder(err)
	}
	return false
}

// IsRetryable tells whether a request may succeed if sent again: network
// errors, 408, 429 and 5xx.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	s := statusOf(err)
	return s == 0 || s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500
}

// Backoff is capped exponential backoff with full jitter: the wait before
// retry n (from 0) is a random duration up to min(Max, Base*2^n), or the
// server's Retry-After when that is longer.
type Backoff struct {
	Base, Max time.Duration
}

// Delay is the wait before retry n after err.
func (b Backoff) Delay(n int, err error) time.Duration {
	base, maxDelay := b.Base, b.Max
	if base <= 0 {
		base = time.Second
	}
	if maxDelay <= 0 {
		maxDelay = time.Minute
	}
	ceiling := maxDelay
	if n < 30 && base<<n < maxDelay {
		ceiling = base << n
	}
	d := time.Duration(rand.Int64N(int64(ceiling) + 1))
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > d {
		d = min(e.RetryAfter, maxDelay)
	}
	return d
}

// ClientOptions configure a Client.
type ClientOptions struct {
	// URL is the orchestrator's base URL (https). Required.
	URL string
	// DispatcherID names this dispatcher. Required.
	DispatcherID string
	// Auth authenticates each request. Default: none.
	Auth Authenticator
	// CAFile is a PEM bundle of CAs trusted besides the system's.
	CAFile string
	// Proxy is the HTTPS proxy URL. Default: HTTPS_PROXY and NO_PROXY from
	// the environment.
	Proxy string
	// Transport replaces the HTTP transport (tests). CAFile and Proxy are
	// then ignored.
	Transport http.RoundTripper
}

// Client speaks the protocol to one orchestrator.
type Client struct {
	base *url.URL
	id   string
	auth Authenticator
	http *http.Client
}

// NewClient checks the options and returns a Client.
func NewClient(o ClientOptions) (*Client, error) {
	u, err := url.Parse(o.URL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("orchestrator URL %q: not an absolute URL", o.URL)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("orchestrator URL %q: must be https", o.URL)
	}
	if o.DispatcherID == "" {
		return nil, errors.New("orchestrator client: no dispatcher ID")
	}
	rt := o.Transport
	if rt == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = http.ProxyFromEnvironment
		if o.Proxy != "" {
			p, err := url.Parse(o.Proxy)
			if err != nil || p.Host == "" {
				return nil, fmt.Errorf("proxy URL %q: not an absolute URL", o.Proxy)
			}
			t.Proxy = http.ProxyURL(p)
		}
		if o.CAFile != "" {
			pool, err := runner.TrustedCAs(o.CAFile, "orchestrator")
			if err != nil {
				return nil, err
			}
			t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		t.MaxIdleConnsPerHost = 32
		rt = t
	}
	auth := o.Auth
	if auth == nil {
		auth = noAuth{}
	}
	c := &Client{base: u, id: o.DispatcherID, auth: auth, http: &http.Client{Transport: rt, CheckRedirect: noRedirects}}
	if x, ok := auth.(*Exchange); ok {
		x.client = c
	}
	return c, nil
}

// maxResponseBytes bounds what is read of one response.
const maxResponseBytes = 8 << 20

// noRedirects refuses redirects: the protocol has none, and following one
// would send the credentials (and task events) wherever it points.
func noRedirects(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("the orchestrator redirected to %s: the protocol has no redirects; check --orchestrator-url", req.URL.Redacted())
}

// capacityMax is a poll's capacity.max: the most leases the dispatcher
// holds at once, maxConcurrent, plus maxQueued with Kueue (a task queued in
// Kueue holds its lease too). The orchestrator re-issues no more than that
// in one poll, so every lapsed lease of a dispatcher within its capacity
// comes back.
func capacityMax(maxConcurrent, maxQueued int, kueue bool) int {
	if kueue {
		return maxConcurrent + maxQueued
	}
	return maxConcurrent
}

// Poll asks for up to free leases, holding up to wait for one. capacity is
// the most leases the dispatcher holds at once; the orchestrator's
// re-issues of the tasks in running and the new leases together stay
// within it.
func (c *Client) Poll(ctx context.Context, free, capacity int, running []string, wait time.Duration) ([]Lease, error) {
	if running == nil {
		running = []string{}
	}
	req := PollRequest{
		DispatcherID: c.id, Capacity: Capacity{Free: free, Max: capacity}, Running: running,
		WaitSeconds: int(wait / time.Second),
	}
	var resp PollResponse
	if err := c.do(ctx, PathPoll, req, &resp, wait+30*time.Second); err != nil {
		return nil, err
	}
	return resp.Leases, nil
}

// Renew extends a lease.
func (c *Client) Renew(ctx context.Context, leaseID string, epoch int64) (RenewResponse, error) {
	var resp RenewResponse
	err := c.do(ctx, PathRenew(url.PathEscape(leaseID)), RenewRequest{DispatcherID: c.id, Epoch: epoch}, &resp, 30*time.Second)
	return resp, err
}

// Release hands a lease back unused.
func (c *Client) Release(ctx context.Context, leaseID string, epoch int64) error {
	return c.do(ctx, PathRelease(url.PathEscape(leaseID)), ReleaseRequest{DispatcherID: c.id, Epoch: epoch}, nil, 30*time.Second)
}

// Report sends an event.
func (c *Client) Report(ctx context.Context, taskID string, e Event) error {
	return c.do(ctx, PathEvents(url.PathEscape(taskID)), e, nil, 30*time.Second)
}

// Log sends a log chunk.
func (c *Client) Log(ctx context.Context, taskID string, l LogChunk) error {
	return c.do(ctx, PathLogs(url.PathEscape(taskID)), l, nil, 30*time.Second)
}

func (c *Client) do(ctx context.Context, path string, in, out any, timeout time.Duration) error {
	err := c.try(ctx, path, in, out, timeout)
	if statusOf(err) == http.StatusUnauthorized {
		// A token may have expired early or been revoked: get a new one
		// and try once more before calling it fatal.
		c.auth.Invalidate()
		err = c.try(ctx, path, in, out, timeout)
	}
	return err
}

func (c *Client) try(ctx context.Context, path string, in, out any, timeout time.Duration) error {
	token, err := c.auth.Token(ctx)
	if err != nil {
		return fmt.Errorf("orchestrator credentials: %w", err)
	}
	return c.post(ctx, path, token, in, out, timeout)
}

func (c *Client) post(ctx context.Context, path, token string, in, out any, timeout time.Duration) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.base.String(), "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderProtocol, Version)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return err
	}
	if len(b) > maxResponseBytes {
		return fmt.Errorf("orchestrator: %s: the response is larger than %d MiB", path, maxResponseBytes>>20)
	}
	if resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if resp.StatusCode/100 != 2 {
		e := &Error{Status: resp.StatusCode}
		var eb ErrorBody
		if json.Unmarshal(b, &eb) == nil {
			e.Code, e.Message = eb.Code, eb.Message
		}
		if e.Message == "" {
			e.Message = strings.TrimSpace(string(b[:min(len(b), 512)]))
		}
		if s := resp.Header.Get("Retry-After"); s != "" {
			if n, err := strconv.Atoi(s); err == nil {
				e.RetryAfter = time.Duration(n) * time.Second
			}
		}
		return e
	}
	if out == nil || len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("orchestrator: %s: decoding the response: %w", path, err)
	}
	return nil
}

package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

// heldReader reads from r, but a namespace read waits until release is
// closed or the request's context ends, whichever comes first.
type heldReader struct {
	client.Reader
	entered chan struct{}
	once    sync.Once
	release chan struct{}
}

func (h *heldReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Namespace); ok {
		h.once.Do(func() { close(h.entered) })
		select {
		case <-h.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Reader.Get(ctx, key, obj, opts...)
}

// TestDetachedFinishesRequestsInFlightAtShutdown cancels the server's base
// context, as controller-runtime does before it drains, while one request
// is reading its namespace and another waits for the only worker: both are
// answered, allowed.
func TestDetachedFinishesRequestsInFlightAtShutdown(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader := &heldReader{
		Reader:  fake.NewClientBuilder().WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, runnerSA(), taskJob()).Build(),
		entered: make(chan struct{}),
		release: make(chan struct{}),
	}
	h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: platformConfig, Mutate: true})
	stopping := make(chan struct{})
	srv := httptest.NewUnstartedServer(Detached(Pooled(&webhook.Admission{Handler: h}, 1), stopping))
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	srv.Config.BaseContext = func(net.Listener) context.Context { return base }
	srv.Start()
	defer srv.Close()

	req := request(t, runnerPod("registry.example.com/runner:1"))
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &req.AdmissionRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code   int
		review admissionv1.AdmissionReview
		err    error
	}
	answers := make(chan answer, 2)
	post := func() {
		var a answer
		resp, err := srv.Client().Post(srv.URL+"/mutate-pods?timeout=10s", "application/json", bytes.NewReader(body))
		if err != nil {
			answers <- answer{err: err}
			return
		}
		defer func() { _ = resp.Body.Close() }()
		a.code = resp.StatusCode
		a.err = json.NewDecoder(resp.Body).Decode(&a.review)
		answers <- a
	}
	go post()
	<-reader.entered // the first request holds the worker
	go post()        // the second waits for it (or is about to)

	close(stopping)
	cancelBase()
	close(reader.release)
	for range 2 {
		a := <-answers
		if a.err != nil || a.code != http.StatusOK || a.review.Response == nil || !a.review.Response.Allowed {
			t.Errorf("answered %d %+v (%v), want 200 and allowed", a.code, a.review.Response, a.err)
		}
	}
}

// TestDetachedEndsWithTheClientOrTheTimeout checks the request context
// Detached gives: it ends when the client goes away (while the server is
// not stopping), and at the request's own timeout.
func TestDetachedEndsWithTheClientOrTheTimeout(t *testing.T) {
	t.Parallel()
	t.Run("client gone", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		var err error
		Detached(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
				err = r.Context().Err()
			case <-time.After(5 * time.Second):
			}
		}), make(chan struct{})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", nil).WithContext(ctx))
		if err == nil {
			t.Error("the context lived on after the client went away")
		}
	})
	tests := []struct {
		name  string
		query string
		want  time.Duration
	}{
		{name: "the API server's timeout", query: "?timeout=5s", want: 5 * time.Second},
		{name: "no timeout", query: "", want: defaultTimeout},
		{name: "unreadable", query: "?timeout=soon", want: defaultTimeout},
		{name: "longer than any webhook may wait", query: "?timeout=1h", want: maxTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var deadline time.Time
			before := time.Now()
			Detached(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				deadline, _ = r.Context().Deadline()
			}), make(chan struct{})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/"+tt.query, nil))
			after := time.Now()
			if deadline.Before(before.Add(tt.want)) || deadline.After(after.Add(tt.want)) {
				t.Errorf("deadline %s after the request, want %s", deadline.Sub(before), tt.want)
			}
		})
	}
}

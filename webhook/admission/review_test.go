package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// reviewBodies are AdmissionReviews the two paths must answer alike: the
// ones podReviews takes and the ones it leaves to controller-runtime.
func reviewBodies(t testing.TB) map[string][]byte {
	t.Helper()
	marshal := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	v1 := metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}
	review := func(req admissionv1.AdmissionRequest) []byte {
		return marshal(admissionv1.AdmissionReview{TypeMeta: v1, Request: &req})
	}
	create := request(t, runnerPod("registry.example.com/runner:1")).AdmissionRequest

	update := create
	update.Operation = admissionv1.Update
	update.OldObject = update.Object

	ephemeral := update
	ephemeral.SubResource = "ephemeralcontainers"

	denied := request(t, runnerPod("registry.example.com/runner:1")).AdmissionRequest
	denied.UserInfo = authenticationv1.UserInfo{Username: "mallory"}

	other := request(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}}).AdmissionRequest

	exec := admissionv1.AdmissionRequest{
		UID: "2", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "PodExecOptions"}, Namespace: "team-a", Name: "runner-1",
		Operation: admissionv1.Connect, SubResource: "exec",
		Object: runtime.RawExtension{Raw: []byte(`{"kind":"PodExecOptions","apiVersion":"v1","container":"runner"}`)},
	}

	notAPod := create
	notAPod.Object = runtime.RawExtension{Raw: []byte(`"a string, not a pod"`)}

	noObject := create
	noObject.Object = runtime.RawExtension{}

	body := map[string][]byte{
		"create":                  review(create),
		"update":                  review(update),
		"ephemeral containers":    review(ephemeral),
		"denied":                  review(denied),
		"not a runner":            review(other),
		"connect":                 review(exec),
		"object not a pod":        review(notAPod),
		"no object":               review(noObject),
		"v1beta1":                 bytes.Replace(review(create), []byte(`"admission.k8s.io/v1"`), []byte(`"admission.k8s.io/v1beta1"`), 1),
		"no version":              marshal(admissionv1.AdmissionReview{Request: &create}),
		"no request":              marshal(admissionv1.AdmissionReview{TypeMeta: v1}),
		"not JSON":                []byte(`{"apiVersion":"admission.k8s.io/v1","request":{"kind":{"version":"v1","kind":"Pod"}`),
		"wrong kind of review":    []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{"uid":"3","kind":{"version":"v1","kind":"Pod"}}}`),
		"kind written twice":      bytes.Replace(review(create), []byte(`"kind":{"group":"","version":"v1","kind":"Pod"}`), []byte(`"kind":{"group":"","version":"v1","kind":"Pod"},"kind":{"group":"","version":"v1","kind":"Binding"}`), 1),
		"field names in capitals": bytes.Replace(review(create), []byte(`"serviceAccountName"`), []byte(`"ServiceAccountName"`), 1),
		"empty":                   {},
	}
	if !bytes.Contains(body["kind written twice"], []byte("Binding")) || !bytes.Contains(body["field names in capitals"], []byte("ServiceAccountName")) {
		t.Fatal("the review bodies no longer hold what their cases name")
	}
	return body
}

// controllerRuntimeOnly is Serve without podReviews: every review decoded
// by controller-runtime's Webhook, each pod by the handler.
func controllerRuntimeOnly(h *Handler) http.Handler {
	return Detached(Pooled(Undecided(&webhook.Admission{Handler: encodedPatch{h}}), 2), make(chan struct{}))
}

func serveBody(t testing.TB, srv http.Handler, contentType string, body []byte) (int, string) {
	t.Helper()
	r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/mutate-pods", bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

// TestPodReviewsAnswerAsControllerRuntime sends each review through Serve
// and through controller-runtime's Webhook alone, to the mutating and the
// validating handler: the answers are the same bytes, whichever path took
// them.
func TestPodReviewsAnswerAsControllerRuntime(t *testing.T) {
	for _, mutate := range []bool{true, false} {
		h := newHandler(t, mutate)
		fast, slow := Serve(h, 2, make(chan struct{})), controllerRuntimeOnly(h)
		// podReviews alone, on a body no pool has read ahead.
		wh := &webhook.Admission{Handler: encodedPatch{h}}
		unpooled := Undecided(podReviews{wh: wh, next: wh})
		for name, body := range reviewBodies(t) {
			for _, ct := range []string{"application/json", "application/yaml", ""} {
				t.Run(fmtCase(mutate, name, ct), func(t *testing.T) {
					wantCode, want := serveBody(t, slow, ct, body)
					for path, srv := range map[string]http.Handler{"Serve": fast, "podReviews unpooled": unpooled} {
						if gotCode, got := serveBody(t, srv, ct, body); gotCode != wantCode || got != want {
							t.Errorf("%s answered %d:\n%s\ncontroller-runtime's Webhook %d:\n%s", path, gotCode, got, wantCode, want)
						}
					}
				})
			}
		}
	}
}

func fmtCase(mutate bool, name, contentType string) string {
	path := "validate"
	if mutate {
		path = "mutate"
	}
	return path + "/" + strings.ReplaceAll(name, " ", "_") + "/" + strings.ReplaceAll(contentType, "/", "_")
}

// TestPodReviewsDecodeEachPodOnce checks that a v1 review of a pod takes
// the one-pass path: the request the handler gets carries the pods decoded,
// not their bytes.
func TestPodReviewsDecodeEachPodOnce(t *testing.T) {
	var got []runtime.RawExtension
	spy := admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		got = append(got, req.Object, req.OldObject)
		return admission.Allowed("")
	})
	srv := Serve(spy, 1, make(chan struct{}))
	body := reviewBodies(t)["update"]
	if code, answer := serveBody(t, srv, "application/json", body); code != http.StatusOK || !strings.Contains(answer, `"allowed":true`) {
		t.Fatalf("answer %d: %s", code, answer)
	}
	if len(got) != 2 {
		t.Fatalf("the handler was called %d times, want once", len(got)/2)
	}
	for i, o := range got {
		pod, ok := o.Object.(*corev1.Pod)
		if !ok || o.Raw != nil || pod.Spec.ServiceAccountName != "runner" {
			t.Errorf("object %d: %T with %d raw bytes (service account %v), want the decoded runner pod alone", i, o.Object, len(o.Raw), pod)
		}
	}
}

// FuzzPodReviews: for any body, Serve answers as controller-runtime's
// Webhook does (the one-pass path never answers what the other would not).
func FuzzPodReviews(f *testing.F) {
	for _, body := range reviewBodies(f) {
		f.Add(body)
	}
	h := newHandler(f, true)
	fast, slow := Serve(h, 2, make(chan struct{})), controllerRuntimeOnly(h)
	f.Fuzz(func(t *testing.T, body []byte) {
		wantCode, want := serveBody(t, slow, "application/json", body)
		gotCode, got := serveBody(t, fast, "application/json", body)
		if gotCode != wantCode || got != want {
			t.Errorf("Serve answered %d:\n%s\ncontroller-runtime's Webhook %d:\n%s", gotCode, got, wantCode, want)
		}
	})
}

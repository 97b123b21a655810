package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func TestUndecided(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		answer   func() admission.Response
		status   int
		contains string
	}{
		{name: "cannot decide", answer: func() admission.Response {
			return admission.Errored(http.StatusInternalServerError, errors.New("reading namespace team-a: connection refused"))
		}, status: http.StatusInternalServerError, contains: "runwarden webhook could not decide: reading namespace team-a: connection refused"},
		{name: "panic", answer: func() admission.Response { panic("boom") }, status: http.StatusInternalServerError, contains: "panic: boom"},
		{name: "denied", answer: func() admission.Response { return admission.Denied("runwarden policy: no-privileged") }, status: http.StatusOK, contains: `"allowed":false`},
		{name: "bad request", answer: func() admission.Response {
			return admission.Errored(http.StatusBadRequest, errors.New("decoding the pod"))
		}, status: http.StatusOK, contains: `"code":400`},
		{name: "allowed", answer: func() admission.Response { return admission.Allowed("") }, status: http.StatusOK, contains: `"allowed":true`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := Undecided(&webhook.Admission{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
				return tt.answer()
			})})
			review := admissionv1.AdmissionReview{
				TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
				Request: &admissionv1.AdmissionRequest{
					UID: "u1", Operation: admissionv1.Create, Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
					Object: runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"Pod"}`)},
				},
			}
			body, _ := json.Marshal(review)
			req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/mutate-pods", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			got, _ := io.ReadAll(rec.Result().Body)
			if rec.Code != tt.status || !strings.Contains(string(got), tt.contains) {
				t.Errorf("status %d body %s, want %d containing %q", rec.Code, got, tt.status, tt.contains)
			}
		})
	}
}

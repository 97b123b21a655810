package admission

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func TestEncodePatchIsJSONMarshal(t *testing.T) {
	shaped := newHandler(t, true).Handle(t.Context(), request(t, runnerPod("registry.example.com/runner:1")))
	if len(shaped.Patches) < 5 {
		t.Fatalf("the shaped runner pod has %d patch operations, want at least 5", len(shaped.Patches))
	}
	tests := []struct {
		name string
		ops  []jsonpatch.Operation
	}{
		{"none", []jsonpatch.Operation{}},
		{"add and replace without a value say null", []jsonpatch.Operation{{Operation: "add", Path: "/a"}, {Operation: "replace", Path: "/b"}}},
		{"other operations leave a nil value out", []jsonpatch.Operation{{Operation: "remove", Path: "/a"}, {Operation: "test", Path: "/b", Value: "x"}}},
		{"a typed nil is null", []jsonpatch.Operation{{Operation: "add", Path: "/a", Value: (*corev1.Container)(nil)}}},
		{"escapes as encoding/json", []jsonpatch.Operation{{Operation: "add", Path: "/metadata/annotations/a~1<b>&c", Value: "\"<script>\" \u2028 é"}}},
		{"values with their own MarshalJSON", []jsonpatch.Operation{{Operation: "add", Path: "/spec/containers/0/resources", Value: &corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourceCPU: resource.MustParse("500m")},
		}}}},
		{"the shaped runner pod's", shaped.Patches},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := encodePatch(tt.ops)
			if err != nil {
				t.Fatal(err)
			}
			want, err := json.Marshal(tt.ops)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("encodePatch:\n%s\njson.Marshal:\n%s", got, want)
			}
		})
	}
	// Each patch is its own: encoding others, concurrently too, in the
	// buffers it was encoded in, leaves it as it was.
	first, err := encodePatch(shaped.Patches)
	if err != nil {
		t.Fatal(err)
	}
	want := string(first)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				if _, err := encodePatch([]jsonpatch.Operation{{Operation: "add", Path: fmt.Sprintf("/x%d/%d", i, j), Value: strings.Repeat("y", j*100)}}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if string(first) != want {
		t.Errorf("a patch changed as others were encoded:\n%s", first)
	}
}

// TestServeAnswersWithTheEncodedPatch sends a runner pod's AdmissionReview
// through Serve, as the API server does: the answer is a JSON patch of the
// same operations the handler made, and it shapes the pod.
func TestServeAnswersWithTheEncodedPatch(t *testing.T) {
	h := newHandler(t, true)
	pod := runnerPod("registry.example.com/runner:1")
	req := request(t, pod)
	want := h.Handle(t.Context(), req)
	srv := Serve(h, 2, make(chan struct{}))
	body, err := json.Marshal(admissionv1.AdmissionReview{Request: ptr.To(req.AdmissionRequest)})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/mutate-pods", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("answer %d: %s", w.Code, w.Body)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &review); err != nil || review.Response == nil {
		t.Fatalf("the answer is no AdmissionReview (%v): %s", err, w.Body)
	}
	got := review.Response
	if !got.Allowed || got.PatchType == nil || *got.PatchType != admissionv1.PatchTypeJSONPatch || got.UID != req.UID {
		t.Fatalf("answer allowed=%v patchType=%v uid=%q, want allowed, a JSON patch, uid %q", got.Allowed, got.PatchType, got.UID, req.UID)
	}
	var ops []jsonpatch.Operation
	if err := json.Unmarshal(got.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	// Compare as JSON values: the values decode to maps, not API types.
	wantJSON, _ := json.Marshal(want.Patches)
	var wantOps []jsonpatch.Operation
	_ = json.Unmarshal(wantJSON, &wantOps)
	if diff := cmp.Diff(wantOps, ops); diff != "" {
		t.Errorf("patch (-handler +served):\n%s", diff)
	}
	if shaped := mutatedPod(t, pod, admission.Response{Patches: ops}); len(shaped.Spec.InitContainers) == 0 && len(shaped.Spec.Tolerations) == 0 {
		t.Errorf("the served patch does not shape the pod: %+v", shaped.Spec)
	}
}

package admission

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/tidwall/gjson"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"
)

// maxReview is controller-runtime's limit on an AdmissionReview's body.
const maxReview = 7 << 20

// podReviews serves the AdmissionReviews the API server sends about pods
// (admission.k8s.io/v1, the request's kind a v1 Pod) decoding each in one
// pass, its pods typed. controller-runtime's Webhook decodes the body once
// to read its kind, again into the review with the pods as raw bytes, and
// the handler decoded each pod a third time: 22% of the webhook's CPU at
// saturation. Every other request (another kind or version, an empty or
// oversized body, another content type, a body that does not decode as
// such a review) goes to next, controller-runtime's Webhook, which answers
// it as before.
//
// The decoder is the one the API machinery and the handler use
// (sigs.k8s.io/json, case-sensitive), and the answer is encoded as
// controller-runtime encodes it, after the same Webhook.Handle (the panic
// recovery, the UID, the status): TestPodReviewsAnswerAsControllerRuntime
// compares the two paths' bytes.
type podReviews struct {
	wh   *admission.Webhook
	next http.Handler
}

// podReview is an AdmissionReview whose object and old object are pods:
// the outer fields win over the embedded request's of the same JSON name.
type podReview struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Request    *podRequest `json:"request"`
}

type podRequest struct {
	admissionv1.AdmissionRequest
	Object    *corev1.Pod `json:"object"`
	OldObject *corev1.Pod `json:"oldObject"`
}

func (p podReviews) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.Header.Get("Content-Type") != "application/json" {
		p.next.ServeHTTP(w, r)
		return
	}
	body, ok := readAhead(r)
	if !ok {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, maxReview+1))
		_ = r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if err != nil {
			p.next.ServeHTTP(w, r)
			return
		}
	}
	if len(body) > maxReview || !aboutPod(body) {
		p.next.ServeHTTP(w, r)
		return
	}
	var review podReview
	if err := kjson.UnmarshalCaseSensitivePreserveInts(body, &review); err != nil ||
		review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" ||
		review.Request == nil || !podKind(review.Request.Kind.Group, review.Request.Kind.Version, review.Request.Kind.Kind) {
		p.next.ServeHTTP(w, r)
		return
	}
	req := admission.Request{AdmissionRequest: review.Request.AdmissionRequest}
	if review.Request.Object != nil {
		req.Object = runtime.RawExtension{Object: review.Request.Object}
	}
	if review.Request.OldObject != nil {
		req.OldObject = runtime.RawExtension{Object: review.Request.OldObject}
	}
	resp := p.wh.Handle(r.Context(), req)
	out := admissionv1.AdmissionReview{Response: &resp.AdmissionResponse}
	out.SetGroupVersionKind(admissionv1.SchemeGroupVersion.WithKind("AdmissionReview"))
	// As controller-runtime writes it: one Write, ending in a newline.
	if err := json.NewEncoder(w).Encode(out); err != nil {
		http.Error(w, "encoding the answer: "+err.Error(), http.StatusInternalServerError)
	}
}

// aboutPod tells, without decoding the body, whether it may be a v1
// AdmissionReview about a pod; the decoded review decides.
func aboutPod(body []byte) bool {
	res := gjson.GetManyBytes(body, "apiVersion", "request.kind.group", "request.kind.version", "request.kind.kind")
	return res[0].Str == admissionv1.SchemeGroupVersion.String() && podKind(res[1].Str, res[2].Str, res[3].Str)
}

func podKind(group, version, kind string) bool {
	return group == "" && version == "v1" && kind == "Pod"
}

// podOf is the pod of a request's object: the one podReviews decoded, or
// decoded from the raw bytes.
func podOf(o runtime.RawExtension) (*corev1.Pod, error) {
	if pod, ok := o.Object.(*corev1.Pod); ok && pod != nil {
		return pod, nil
	}
	return decodePod(o.Raw)
}

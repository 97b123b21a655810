package admission

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// Undecided turns an answer that says the webhook could not decide (an
// AdmissionReview with allowed false and a status code of 500 or more:
// admission.Errored with a server error, or a recovered panic) into an HTTP
// 500 with the cause as the body. The API server words a review with
// allowed false as "admission webhook ... denied the request", which every
// caller (the Job controller, the dispatcher, a user) takes for a final
// answer; an HTTP error is a failed call, which failurePolicy Fail refuses
// as "failed calling webhook" and the Job controller retries. Denials and
// every other answer pass through untouched.
func Undecided(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&undecidedWriter{ResponseWriter: w}, r)
	})
}

// undecidedWriter watches the one Write of an AdmissionReview
// (controller-runtime encodes it in one call, with no explicit status).
type undecidedWriter struct {
	http.ResponseWriter
	wrote bool
}

// notAllowed is the only part of the answer the check reads; looking for it
// first keeps allowed answers from being decoded twice.
var notAllowed = []byte(`"allowed":false`)

func (w *undecidedWriter) WriteHeader(code int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *undecidedWriter) Write(b []byte) (int, error) {
	if !w.wrote && bytes.Contains(b, notAllowed) {
		var review struct {
			Response *struct {
				Allowed bool `json:"allowed"`
				Status  *struct {
					Code    int32  `json:"code"`
					Message string `json:"message"`
				} `json:"status"`
			} `json:"response"`
		}
		if json.Unmarshal(b, &review) == nil && review.Response != nil && !review.Response.Allowed &&
			review.Response.Status != nil && review.Response.Status.Code >= http.StatusInternalServerError {
			w.wrote = true
			http.Error(w.ResponseWriter, "runwarden webhook could not decide: "+review.Response.Status.Message, http.StatusInternalServerError)
			return len(b), nil
		}
	}
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

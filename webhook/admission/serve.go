package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/runwarden/runwarden/internal/bufpool"
)

// Serve is the HTTP handler of one of runwarden-webhook's paths: h behind
// controller-runtime's AdmissionReview decoding and encoding (a v1 review
// of a pod decoded in one pass: podReviews), its patch
// encoded once (encodedPatch), a server error answered as one (Undecided),
// served on workers long-lived goroutines (Pooled; <= 0: four per CPU),
// each request with a context of its own (Detached; close stopping before
// the server's context is cancelled).
func Serve(h admission.Handler, workers int, stopping <-chan struct{}) http.Handler {
	wh := &webhook.Admission{Handler: encodedPatch{h}}
	return Detached(Pooled(Undecided(podReviews{wh: wh, next: wh}), workers), stopping)
}

// encodedPatch encodes a response's patch operations itself, into the
// response's Patch, before controller-runtime's Response.Complete would:
// Complete marshals them with encoding/json, which calls each operation's
// MarshalJSON, which marshals its value, and then checks and compacts
// every byte of each result again: half the cost of the patch, and at
// saturation as much CPU as the rest of the admission. The bytes are the
// same as json.Marshal's (TestEncodePatchIsJSONMarshal).
type encodedPatch struct{ admission.Handler }

func (e encodedPatch) Handle(ctx context.Context, req admission.Request) admission.Response {
	resp := e.Handler.Handle(ctx, req)
	if len(resp.Patches) == 0 {
		return resp
	}
	raw, err := encodePatch(resp.Patches)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding the patch: %w", err))
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType, resp.Patches = raw, &pt, nil
	return resp
}

// patchBuffers are encodePatch's scratch buffers: a patch is encoded into
// one grown by earlier patches and copied out at its size, instead of
// growing a buffer of its own (a runner pod's patch of 10 operations, 3 KiB,
// allocated 8 KiB that way); a rare patch past 64 KiB is not held.
var patchBuffers = bufpool.New(4<<10, 64<<10)

// encodePatch is json.Marshal(ops), each value encoded once.
func encodePatch(ops []jsonpatch.Operation) ([]byte, error) {
	buf := patchBuffers.Get()
	defer patchBuffers.Put(buf)
	out, err := appendPatch(buf, ops)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(out), nil
}

// appendPatch writes ops to buf as json.Marshal would and returns buf's bytes.
func appendPatch(buf *bytes.Buffer, ops []jsonpatch.Operation) ([]byte, error) {
	enc := json.NewEncoder(buf)
	// value writes v as json.Marshal would (Encode adds a newline).
	value := func(v any) error {
		if err := enc.Encode(v); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1)
		return nil
	}
	buf.WriteByte('[')
	for i := range ops {
		op := &ops[i]
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(`{"op":`)
		if err := value(op.Operation); err != nil {
			return nil, err
		}
		buf.WriteString(`,"path":`)
		if err := value(op.Path); err != nil {
			return nil, err
		}
		// As jsonpatch's Operation.MarshalJSON: add and replace always
		// carry a value (null when nil), the others only a non-nil one.
		if op.Value != nil || op.Operation == "add" || op.Operation == "replace" {
			buf.WriteString(`,"value":`)
			if err := value(op.Value); err != nil {
				return nil, err
			}
		}
		buf.WriteByte('}')
	}
	buf.WriteByte(']')
	return buf.Bytes(), nil
}

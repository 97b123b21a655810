package render

import "sigs.k8s.io/kustomize/kyaml/openapi"

// WarmSchema starts decoding, in the background, the Kubernetes OpenAPI
// schema built into Kustomize, in which strategic merge patches look up how
// to merge each field. The library decodes it on first use, about 23 ms on
// one core, under a lock every build takes at its start (openapi.SetSchema).
// Called before the input is read, it runs beside the reading and parsing
// that do not need it. Render does not depend on it: the library decodes the schema
// once, under its own lock, whoever asks first.
func WarmSchema() {
	go openapi.Schema()
}

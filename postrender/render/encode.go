package render

import (
	"encoding/json"
	"unicode/utf8"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// resourceYAML returns what r.AsYAML returns, the text `kustomize build`
// writes for a resource, in about half the time.
//
// AsYAML encodes the resource to YAML, decodes that into Go values, encodes
// those to JSON, decodes the JSON with the YAML v2 decoder and encodes the
// result with the YAML v2 encoder. The JSON text is only a way between two
// Go values: resourceYAML copies the values that way leaves as they are
// (viaJSON), runs the JSON step itself on the others, and every other step
// with the same libraries. Where the JSON step fails (a float that is not a
// number, a character the YAML v2 decoder refuses) or could fail on the
// whole document only (nesting deeper than the decoder allows), it calls
// AsYAML, so the errors are AsYAML's too. TestResourceYAMLIsAsYAML,
// FuzzResourceYAML and TestEncodeCasesMatchKustomizeBuild check this.
func resourceYAML(r *resource.Resource) ([]byte, error) {
	if out, ok := ownYAML(r); ok {
		return out, nil
	}
	return r.AsYAML()
}

// ownYAML is resourceYAML's own path: the text, and false where AsYAML must
// write the resource (or report why it cannot).
func ownYAML(r *resource.Resource) ([]byte, bool) {
	if n := r.YNode(); n == nil || n.Kind != yaml.MappingNode {
		return nil, false
	}
	s, err := r.RNode.String()
	if err != nil {
		return nil, false
	}
	m := map[string]any{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		return nil, false
	}
	v, ok := viaJSON(m, maxCopiedDepth)
	if !ok {
		return nil, false
	}
	out, err := yamlv2.Marshal(v)
	if err != nil {
		return nil, false
	}
	return out, true
}

// maxCopiedDepth is how deep viaJSON copies maps and lists: the YAML v2
// decoder refuses JSON nested more than 10,000 levels, which copying would
// not notice, and no manifest comes near 100.
const maxCopiedDepth = 1000

// viaJSON returns the value the YAML v2 decoder makes of v's JSON encoding
// (as sigs.k8s.io/yaml's JSONToYAML decodes it), and false where JSON
// cannot encode v, the decoder refuses the JSON, or v nests more than depth
// maps and lists. The values JSON writes in a form YAML reads back
// unchanged (strings of plain characters, ints, booleans, null, and maps
// and lists of them) are copied; any other value goes through the two steps
// themselves (jsonThenYAML), which read a value alone as they read it
// inside the whole document, but for its depth.
func viaJSON(v any, depth int) (any, bool) {
	switch x := v.(type) {
	case nil:
		return nil, true
	case bool:
		return x, true
	case int:
		// JSON writes it in decimal; YAML v2 reads a decimal that fits an
		// int as an int.
		return x, true
	case string:
		if plainJSONString(x) {
			return x, true
		}
	case map[string]any:
		if x == nil {
			return nil, true // JSON null
		}
		if depth < 1 {
			return nil, false
		}
		out := make(map[any]any, len(x))
		plainKeys := true
		for k, e := range x {
			if !plainJSONString(k) || jsonKeyTooLong(k) {
				plainKeys = false
				break
			}
			c, ok := viaJSON(e, depth-1)
			if !ok {
				return nil, false
			}
			out[k] = c
		}
		if plainKeys {
			return out, true
		}
	case []any:
		if x == nil {
			return nil, true // JSON null
		}
		if depth < 1 {
			return nil, false
		}
		out := make([]any, len(x))
		for i, e := range x {
			c, ok := viaJSON(e, depth-1)
			if !ok {
				return nil, false
			}
			out[i] = c
		}
		return out, true
	}
	// Floats (2.0 is written 2 and read as an int), timestamps, strings
	// JSON or YAML change, keys YAML reads differently, types JSON refuses.
	if deeperThan(v, depth) {
		return nil, false
	}
	return jsonThenYAML(v)
}

// jsonThenYAML runs AsYAML's middle steps on v: JSON encoding, then YAML v2
// decoding.
func jsonThenYAML(v any) (any, bool) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	var out any
	if err := yamlv2.Unmarshal(b, &out); err != nil {
		return nil, false
	}
	return out, true
}

// plainJSONString reports whether s comes back from a JSON encoding read by
// the YAML v2 decoder unchanged: valid UTF-8 (JSON replaces invalid bytes),
// no control characters, and none of the characters YAML reads as line
// breaks or refuses in a stream (JSON writes U+0085 and DEL as they are;
// U+2028, U+2029 and U+FEFF are left out for caution).
func plainJSONString(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return false
		case r < 0xa0, r == 0x2028, r == 0x2029, r == 0xfeff, r == 0xfffe, r == 0xffff:
			return false
		}
		i += size
	}
	return true
}

// jsonKeyTooLong reports whether key, JSON-encoded, may pass the 1,024
// characters (quotes included) the YAML v2 decoder allows an implicit key,
// past which it refuses the JSON; 1,000 bytes leaves a margin. Such a key
// goes through the JSON step.
func jsonKeyTooLong(key string) bool {
	// JSON writes each byte as at most six characters (\u003c).
	return len(key) > 1000/6 && len(jsonString(key)) > 1000
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// deeperThan reports whether v nests maps and lists more than limit levels
// deep, counting v: the depth left for a value viaJSON hands to the JSON
// step, which reads it alone.
func deeperThan(v any, limit int) bool {
	if limit < 0 {
		return true
	}
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			if deeperThan(e, limit-1) {
				return true
			}
		}
	case map[any]any:
		for _, e := range x {
			if deeperThan(e, limit-1) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if deeperThan(e, limit-1) {
				return true
			}
		}
	}
	return false
}

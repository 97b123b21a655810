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
// Go values: resourceYAML makes the value the YAML v2 decoder would make of
// it directly where that value is certain (viaJSON), runs the JSON step on
// the rest, and every other step with the same libraries. Where JSON refuses
// a value (a float that is not a number), it calls AsYAML itself, so the
// errors are AsYAML's too.
// TestResourceYAMLIsAsYAML and FuzzResourceYAML check the two agree.
func resourceYAML(r *resource.Resource) ([]byte, error) {
	if n := r.YNode(); n == nil || n.Kind != yaml.MappingNode {
		return r.AsYAML()
	}
	s, err := r.RNode.String()
	if err != nil {
		return r.AsYAML()
	}
	m := map[string]any{}
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		return r.AsYAML()
	}
	v, ok := viaJSON(m)
	if !ok {
		return r.AsYAML()
	}
	out, err := yamlv2.Marshal(v)
	if err != nil {
		return r.AsYAML()
	}
	return out, nil
}

// viaJSON returns the value the YAML v2 decoder makes of v's JSON encoding
// (as sigs.k8s.io/yaml's JSONToYAML decodes it), and false where JSON
// cannot encode v. The values JSON writes in a form YAML reads back
// unchanged (strings of plain characters, ints, booleans, null, and maps and
// lists of them) are copied; any other value goes through the two steps
// themselves (jsonThenYAML).
func viaJSON(v any) (any, bool) {
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
		out := make(map[any]any, len(x))
		plainKeys := true
		for k, e := range x {
			if !plainJSONString(k) || jsonKeyTooLong(k) {
				plainKeys = false
				break
			}
			c, ok := viaJSON(e)
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
		out := make([]any, len(x))
		for i, e := range x {
			c, ok := viaJSON(e)
			if !ok {
				return nil, false
			}
			out[i] = c
		}
		return out, true
	}
	// Floats (2.0 is written 2 and read as an int), timestamps, strings
	// JSON or YAML change, keys YAML reads differently, types JSON refuses.
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
// and none of the characters YAML reads as line breaks or refuses in a
// stream (JSON writes some of them unescaped), nor control characters.
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
		case r < 0xa0, r == 0x2028, r == 0x2029, r == 0xfeff,
			r >= 0xd800 && r < 0xe000, r == 0xfffe, r == 0xffff:
			return false
		}
		i += size
	}
	return true
}

// jsonKeyTooLong reports whether key, JSON-encoded, may be longer than the
// 1,024 characters YAML allows an implicit key, past which the YAML v2
// decoder reads the JSON differently or not at all.
func jsonKeyTooLong(key string) bool {
	// JSON writes each byte as at most six characters (\u003c).
	return len(key) > 1000/6 && len(jsonString(key)) > 1000
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

package policy

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEncodeInputWithConfigJSON checks that an input whose configuration
// was encoded beforehand encodes to the same document as one encoded whole.
func TestEncodeInputWithConfigJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		config map[string]any
	}{
		{name: "empty", config: map[string]any{}},
		{name: "nested", config: map[string]any{"mode": "enforce", "workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true}}, "list": []any{"a", 1.5}}},
		{name: "nil", config: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := runnerInput()
			in.Config = tt.config
			whole, err := encodeInput(in)
			if err != nil {
				t.Fatal(err)
			}
			if in.ConfigJSON, err = json.Marshal(tt.config); err != nil {
				t.Fatal(err)
			}
			pre, err := encodeInput(in)
			if err != nil {
				t.Fatal(err)
			}
			var a, b any
			if err := json.Unmarshal(whole, &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(pre, &b); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(a, b); diff != "" {
				t.Errorf("encoding with ConfigJSON differs (-whole +with ConfigJSON):\n%s", diff)
			}
		})
	}
}

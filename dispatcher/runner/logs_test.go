package runner

import (
	"strings"
	"testing"
)

func TestLastBytes(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("0123456789", 50_000) + "the end\n"
	tests := []struct {
		name, log string
		limit     int
		want      string
	}{
		{"longer than the limit keeps its end", long, 1000, long[len(long)-1000:]},
		{"shorter than the limit is whole", "short", 1000, "short"},
		{"exactly the limit is whole", "0123456789", 10, "0123456789"},
		{"empty", "", 10, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := lastBytes(strings.NewReader(tt.log), tt.limit)
			if err != nil || string(got) != tt.want {
				t.Errorf("lastBytes: %d bytes, %v; want %d bytes", len(got), err, len(tt.want))
			}
		})
	}
}

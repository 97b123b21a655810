package orchestrator

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
)

// TestWireTypesMatchTheOpenAPIFile: every protocol type has exactly the
// fields of its schema in docs/protocol.openapi.yaml, each of the schema's
// type, and sends every field the schema requires; and no protocol type
// holds a type it does not own (of the dispatcher's other packages, of
// Kubernetes', of any package but the standard library's), so a change
// inside the dispatcher or of a library cannot change the protocol
// unnoticed.
func TestWireTypesMatchTheOpenAPIFile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/protocol.openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	body := func(p string) []string {
		return []string{"paths", p, "post", "requestBody", "content", "application/json", "schema"}
	}
	answer := func(p, code string) []string {
		return []string{"paths", p, "post", "responses", code, "content", "application/json", "schema"}
	}
	schema := func(name string) []string { return []string{"components", "schemas", name} }
	tests := []struct {
		name string
		typ  any
		path []string
		// readOnly are fields a type reads only to refuse them.
		readOnly []string
	}{
		{name: "PollRequest", typ: PollRequest{}, path: schema("Poll")},
		{name: "Capacity", typ: Capacity{}, path: append(schema("Poll"), "properties", "capacity")},
		{name: "PollResponse", typ: PollResponse{}, path: answer("/v1/leases:poll", "200")},
		{name: "Lease", typ: Lease{}, path: schema("Lease")},
		{name: "Task", typ: Task{}, path: schema("Task")},
		{name: "Resources", typ: Resources{}, path: append(schema("Task"), "properties", "resources")},
		{name: "ResourceClaim", typ: ResourceClaim{}, path: append(schema("Task"), "properties", "resources", "properties", "claims", "items")},
		{name: "EnvVar", typ: EnvVar{}, path: append(schema("Task"), "properties", "env", "items"), readOnly: []string{"valueFrom"}},
		{name: "RenewRequest", typ: RenewRequest{}, path: body("/v1/leases/{leaseId}:renew")},
		{name: "RenewResponse", typ: RenewResponse{}, path: answer("/v1/leases/{leaseId}:renew", "200")},
		{name: "ReleaseRequest", typ: ReleaseRequest{}, path: body("/v1/leases/{leaseId}:release")},
		{name: "Event", typ: Event{}, path: schema("Event")},
		{name: "Record", typ: Record{}, path: append(schema("Event"), "properties", "record")},
		{name: "ImageRecord", typ: ImageRecord{}, path: append(schema("Event"), "properties", "record", "properties", "images", "items")},
		{name: "LogChunk", typ: LogChunk{}, path: schema("LogChunk")},
		{name: "TokenRequest", typ: TokenRequest{}, path: body("/v1/auth/token")},
		{name: "TokenResponse", typ: TokenResponse{}, path: answer("/v1/auth/token", "200")},
		{name: "ErrorBody", typ: ErrorBody{}, path: []string{"components", "responses", "Error", "content", "application/json", "schema"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, ok := lookup(doc, tc.path)
			if !ok {
				t.Fatalf("no schema at %s", strings.Join(tc.path, "/"))
			}
			props, _ := s["properties"].(map[string]any)
			want := map[string]string{}
			for name, p := range props {
				p, _ := p.(map[string]any)
				if ref, ok := p["$ref"].(string); ok {
					p, _ = lookup(doc, strings.Split(strings.TrimPrefix(ref, "#/"), "/"))
				}
				typ, _ := p["type"].(string)
				want[name] = typ
			}
			for _, f := range tc.readOnly {
				want[f] = "read only"
			}
			got := map[string]string{}
			sent := map[string]bool{}
			rt := reflect.TypeOf(tc.typ)
			for i := range rt.NumField() {
				f := rt.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				got[name] = schemaType(f.Type)
				if slices.Contains(tc.readOnly, name) {
					got[name] = "read only"
				}
				sent[name] = !strings.Contains(opts, "omitempty")
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("fields and their types, the schema (-) against %s (+):\n%s", tc.name, diff)
			}
			req, _ := s["required"].([]any)
			for _, r := range req {
				if !sent[r.(string)] {
					t.Errorf("%s may leave out %s, which the schema requires", tc.name, r)
				}
			}
			if p := foreignType(rt, map[reflect.Type]bool{}); p != "" {
				t.Errorf("%s holds %s, a type the protocol does not own: the protocol's types are its own (the standard library's aside)", tc.name, p)
			}
		})
	}
}

// lookup follows path through doc.
func lookup(doc map[string]any, path []string) (map[string]any, bool) {
	cur := doc
	for _, p := range path {
		next, ok := cur[p].(map[string]any)
		if !ok {
			return nil, false
		}
		cur = next
	}
	return cur, true
}

// schemaType is the JSON schema type Go encodes t as.
func schemaType(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[time.Time](), t == reflect.TypeFor[[]byte]():
		return "string"
	case t == reflect.TypeFor[json.RawMessage]():
		return "any"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice:
		return "array"
	case reflect.Struct, reflect.Map:
		return "object"
	}
	return t.Kind().String()
}

// foreignType names a type that t holds (t included) of a package other
// than this one and the standard library's, or "".
func foreignType(t reflect.Type, seen map[reflect.Type]bool) string {
	if seen[t] {
		return ""
	}
	seen[t] = true
	if p := t.PkgPath(); p != "" && p != reflect.TypeFor[Event]().PkgPath() && strings.Contains(strings.Split(p, "/")[0], ".") {
		return p + "." + t.Name()
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return foreignType(t.Elem(), seen)
	case reflect.Map:
		if p := foreignType(t.Key(), seen); p != "" {
			return p
		}
		return foreignType(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if p := foreignType(t.Field(i).Type, seen); p != "" {
				return p
			}
		}
	}
	return ""
}

// The record converts field for field; times go in whole seconds, UTC, as
// the API server keeps them.
func TestWireRecord(t *testing.T) {
	t.Parallel()
	at := metav1.NewTime(time.Date(2026, 11, 26, 10, 0, 1, 500, time.FixedZone("x", 3600)))
	got := wireRecord(&v1alpha1.TaskRecord{
		SpecDigest: "sha256:a", ShortSpecDigest: "a", PolicyDigest: "p", TemplateDigest: "sha256:t", Mutations: []string{"m"}, Warnings: []string{"w"},
		Images: []v1alpha1.ImageRecord{{Container: "main", Image: "i", ImageID: "i@sha256:b"}}, Node: "n", Pod: "pod", StartedAt: &at,
	})
	start := time.Date(2026, 11, 26, 9, 0, 1, 0, time.UTC)
	want := &Record{
		SpecDigest: "sha256:a", PolicyDigest: "p", TemplateDigest: "sha256:t", Mutations: []string{"m"}, Warnings: []string{"w"},
		Images: []ImageRecord{{Container: "main", Image: "i", ImageID: "i@sha256:b"}}, Node: "n", Pod: "pod", StartedAt: &start,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("wireRecord (-want +got):\n%s", diff)
	}
	if wireRecord(nil) != nil {
		t.Error("no record is sent as none")
	}
	// The JSON is protocol 1.1's, byte for byte: the names, the time
	// format, and nothing of the RunnerTask's own (shortSpecDigest).
	a, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	const wire = `{"specDigest":"sha256:a","policyDigest":"p","templateDigest":"sha256:t","mutations":["m"],"warnings":["w"],` +
		`"images":[{"container":"main","image":"i","imageID":"i@sha256:b"}],"node":"n","pod":"pod","startedAt":"2026-11-26T09:00:01Z"}`
	if string(a) != wire {
		t.Errorf("the wire record encodes as\n%s\nwant\n%s", a, wire)
	}
}

package orchestrator

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// documentedTask is the task JSON of docs/protocol.md's "The task", as the
// document writes it.
func documentedTask(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "## The task\n```json\n")
	doc, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		t.Fatal("docs/protocol.md has no JSON block under \"## The task\"")
	}
	return []byte(doc)
}

// sameJSON fails t unless a and b are the same JSON value.
func sameJSON(t *testing.T, what string, want, got []byte) {
	t.Helper()
	var w, g any
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

// kubeReads is what Kubernetes' own type (the protocol's resources until
// they were the protocol's type) makes of resources JSON, written back as
// JSON: what a Job is built from.
func kubeReads(t *testing.T, resources []byte) ([]byte, error) {
	t.Helper()
	var k *corev1.ResourceRequirements
	if err := json.Unmarshal(resources, &k); err != nil {
		return nil, err
	}
	return json.Marshal(k)
}

// weRead is what the protocol's Resources make of resources JSON, once
// converted to Kubernetes' type, written back as JSON.
func weRead(t *testing.T, resources []byte) ([]byte, error) {
	t.Helper()
	var r *Resources
	if err := json.Unmarshal(resources, &r); err != nil {
		t.Fatalf("the protocol's Resources do not read %s: %v", resources, err)
	}
	k, err := kubeResources(r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(k)
}

// The task of docs/protocol.md reads into the protocol's Task and writes
// back as the same JSON; its resources become, in Kubernetes' type, exactly
// what Kubernetes' own type reads from them, byte for byte: the wire did
// not change when Task.Resources became the protocol's own type.
func TestDocumentedTaskRoundTrips(t *testing.T) {
	t.Parallel()
	doc := documentedTask(t)
	var task Task
	if err := json.Unmarshal(doc, &task); err != nil {
		t.Fatal(err)
	}
	if task.Resources == nil || len(task.Resources.Requests) == 0 {
		t.Fatalf("the documented task has no resources any more: %s", doc)
	}
	out, err := json.Marshal(task)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "the documented task, read and written back", doc, out)

	var raw struct {
		Resources json.RawMessage `json:"resources"`
	}
	if err := json.Unmarshal(doc, &raw); err != nil {
		t.Fatal(err)
	}
	want, err := kubeReads(t, raw.Resources)
	if err != nil {
		t.Fatal(err)
	}
	got, err := weRead(t, raw.Resources)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("the documented resources as Kubernetes' type:\n%s\nwant, as Kubernetes reads them:\n%s", got, want)
	}
}

// Every resources JSON Kubernetes' type reads, the protocol's reads to the
// same Kubernetes value: quantities as strings or numbers, canonical or
// not, with spaces around, null, resource names with a domain, claims.
// Strings write back as they came.
func TestResourcesReadAsKubernetesReadsThem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		resources string
		// roundTrips: the protocol's type writes the same JSON back.
		roundTrips bool
	}{
		{name: "requests and limits", resources: `{"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi", "nvidia.com/gpu": "1"}}`, roundTrips: true},
		{name: "not canonical", resources: `{"requests": {"cpu": "1000m", "memory": "1024Mi", "ephemeral-storage": "1e3"}}`, roundTrips: true},
		{name: "numbers", resources: `{"requests": {"cpu": 1, "memory": 1.5e9}, "limits": {"cpu": 0.5}}`},
		{name: "spaces", resources: `{"limits": {"cpu": " 2 "}}`, roundTrips: true},
		{name: "null is zero", resources: `{"requests": {"cpu": null}}`},
		{name: "claims", resources: `{"claims": [{"name": "gpu", "request": "a"}, {"name": "fpga"}]}`, roundTrips: true},
		{name: "empty lists", resources: `{"requests": {}, "limits": {}}`},
		{name: "empty", resources: `{}`, roundTrips: true},
		{name: "none", resources: `null`, roundTrips: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			want, err := kubeReads(t, []byte(tt.resources))
			if err != nil {
				t.Fatalf("Kubernetes' type does not read %s: %v", tt.resources, err)
			}
			got, err := weRead(t, []byte(tt.resources))
			if err != nil {
				t.Fatalf("kubeResources: %v", err)
			}
			if string(got) != string(want) {
				t.Errorf("as Kubernetes' type:\n%s\nwant, as Kubernetes reads them:\n%s", got, want)
			}
			if !tt.roundTrips {
				return
			}
			var r *Resources
			if err := json.Unmarshal([]byte(tt.resources), &r); err != nil {
				t.Fatal(err)
			}
			back, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, "written back", []byte(tt.resources), back)
		})
	}
}

// A quantity Kubernetes cannot read fails its task alone, saying which:
// the poll's answer is read (Kubernetes' type could not read it, and the
// whole answer was refused, every lease in it lost and the poll retried),
// and the task is refused naming the field and the value.
func TestBadQuantityRefusesTheTask(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		resources string
		want      string
	}{
		{name: "a word", resources: `{"requests": {"cpu": "1 core"}}`, want: `resources.requests[cpu]: "1 core" is not a quantity`},
		{name: "a unit Kubernetes has not", resources: `{"limits": {"memory": "2GB"}}`, want: `resources.limits[memory]: "2GB" is not a quantity`},
		{name: "empty", resources: `{"limits": {"cpu": ""}}`, want: `resources.limits[cpu]: "" is not a quantity`},
		{name: "a boolean", resources: `{"requests": {"memory": "1Gi", "cpu": true}}`, want: `resources.requests[cpu]: "true" is not a quantity`},
		{name: "an object", resources: `{"requests": {"cpu": {"value": 1}}}`, want: `resources.requests[cpu]: "{\"value\": 1}" is not a quantity`},
		{name: "limits before requests", resources: `{"requests": {"cpu": "x"}, "limits": {"cpu": "y"}}`, want: `resources.limits[cpu]: "y"`},
	}
	opts := job.Options{
		DispatcherID: "d-1",
		Template:     corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "runner:1"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := kubeReads(t, []byte(tt.resources)); err == nil {
				t.Errorf("Kubernetes' type reads %s", tt.resources)
			}
			answer := `{"leases": [{"leaseId": "l-1", "epoch": 1, "task": {"id": "t-1", "resources": ` + tt.resources + `}}]}`
			var resp PollResponse
			if err := json.Unmarshal([]byte(answer), &resp); err != nil {
				t.Fatalf("the poll's answer is not read: %v", err)
			}
			_, _, err := leaseJob(resp.Leases[0], "runners", opts)
			if !errors.Is(err, job.ErrInvalidTask) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("leaseJob: %v, want an invalid task saying %s", err, tt.want)
			}
		})
	}
}

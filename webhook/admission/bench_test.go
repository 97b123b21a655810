package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/go-logr/logr"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	kjson "sigs.k8s.io/json"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

// BenchmarkHandle is one admission of a runner pod with the full shipped
// policy set and a platform configuration that turns most policies on:
// decode, the earned check, input, evaluation, secret plan, mutation,
// record and patch. It reads the cluster as runwarden-webhook does (see
// benchHandler): namespaces and service accounts from an informer's
// indexer without copies, the Job decoded from its JSON as from the API
// server's answer.
func BenchmarkHandle(b *testing.B) {
	benchmarkHandle(b, benchHandler(b))
}

// BenchmarkHandleFakeReader is BenchmarkHandle with every read through
// controller-runtime's fake client, which round-trips each object through
// JSON: how BenchmarkHandle read the cluster until 2026-11-27, kept to
// compare with the figures recorded before (docs/benchmarks.md).
func BenchmarkHandleFakeReader(b *testing.B) {
	benchmarkHandle(b, newHandler(b, true))
}

// benchmarkHandle runs h on a runner pod's creation, the decision cached.
// Its context carries a logger that discards: without one,
// controller-runtime's root logger changes 30 s into the process (to one
// that drops everything), and the allocations per admission with it; the
// webhook's own log line is not measured.
func benchmarkHandle(b *testing.B, h *Handler) {
	req := request(b, runnerPod("registry.example.com/runner:1"))
	ctx := log.IntoContext(b.Context(), logr.Discard())
	// The first admission fills the decision cache (a full evaluation,
	// thousands of allocations): made before the loop, as the webhook has
	// made it for the template's first pod, so that the figures do not
	// depend on how many admissions the loop runs.
	if resp := h.Handle(ctx, req); !resp.Allowed {
		b.Fatalf("unexpected response: %+v", resp.Result)
	}
	b.ReportAllocs()
	for b.Loop() {
		if resp := h.Handle(ctx, req); !resp.Allowed || len(resp.Patches) == 0 {
			b.Fatalf("unexpected response: %+v", resp.Result)
		}
	}
}

// benchHandler is newHandler's mutating handler with the reads
// runwarden-webhook makes (webhook/serve.go): namespaces and service
// accounts from the manager's cache, configured with UnsafeDisableDeepCopy
// (indexerReader), and the Job from the API server (apiJobs).
func benchHandler(b *testing.B) *Handler {
	b.Helper()
	set, err := policy.Load(b.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	jobs := map[client.ObjectKey][]byte{}
	for _, o := range handlerObjects() {
		if j, ok := o.(*batchv1.Job); ok {
			raw, err := json.Marshal(j)
			if err != nil {
				b.Fatal(err)
			}
			jobs[client.ObjectKeyFromObject(j)] = raw
			continue
		}
		if err := indexer.Add(o); err != nil {
			b.Fatal(err)
		}
	}
	return New(Options{
		Policies: staticPolicies{set}, Reader: indexerReader{indexer}, Jobs: apiJobs(jobs), Config: platformConfig, Mutate: true,
		Resolver: &Resolver{Image: resolverImage},
	})
}

// indexerReader reads as controller-runtime's cache reader does for an
// object configured with UnsafeDisableDeepCopy: the indexer's object,
// assigned to the caller's without a deep copy.
type indexerReader struct{ indexer cache.Indexer }

func (r indexerReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	item, ok, err := r.indexer.GetByKey(cache.NewObjectName(key.Namespace, key.Name).String())
	if err != nil {
		return err
	}
	if !ok || reflect.TypeOf(item) != reflect.TypeOf(obj) {
		return apierrors.NewNotFound(schema.GroupResource{Resource: fmt.Sprintf("%T", obj)}, key.Name)
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(item).Elem())
	return nil
}

func (r indexerReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return fmt.Errorf("indexerReader: List is not used by the handler")
}

// apiJobs reads Jobs as the manager's API reader does, without the round
// trip: each read decodes the Job from the JSON the API server answers.
type apiJobs map[client.ObjectKey][]byte

func (r apiJobs) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	raw, ok := r[key]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: "batch", Resource: "jobs"}, key.Name)
	}
	return kjson.UnmarshalCaseSensitivePreserveInts(raw, obj)
}

func (r apiJobs) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return fmt.Errorf("apiJobs: List is not used by the handler")
}

// Package render applies a Kustomize overlay to a stream of manifests, in
// process, with the Kustomize library's own loader and transformers: for the
// same overlay and input, the result is the result of `kustomize build`.
//
// Kustomize appends resources with a linear scan of those already appended,
// so one build of n resources costs O(n²). When the overlay only holds
// transformations that work one resource at a time (see shardable), the input
// is split into groups that do not refer to each other by name, each group
// is built with the whole overlay in parallel, and the results are merged in
// Kustomize's own output order. Anything else, and any group that fails,
// falls back to a single build, so the output and the errors are always
// those of one `kustomize build`.
package render

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/resid"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// Errors a caller can check with errors.Is.
var (
	// ErrNoKustomization: the overlay folder holds no kustomization file.
	ErrNoKustomization = errors.New("no kustomization file")
	// ErrOverlayMissing: the overlay folder does not exist.
	ErrOverlayMissing = errors.New("overlay folder does not exist")
	// ErrOverlayIsFile: the overlay is a file (its kustomization, say), not a folder.
	ErrOverlayIsFile = errors.New("is a file, not a folder")
	// ErrNotListed: the kustomization does not list the manifests file, so
	// Helm's manifests would be dropped.
	ErrNotListed = errors.New("the kustomization does not list the manifests file in its resources")
)

// OverlayError is a problem with the overlay itself: its kustomization, a
// patch, a base. File names the kustomization file of the overlay.
type OverlayError struct {
	File string
	Err  error
}

func (e *OverlayError) Error() string { return e.File + ": " + e.Err.Error() }
func (e *OverlayError) Unwrap() error { return e.Err }

// HookConflictError is Kustomize's "already registered id" error when the
// input holds a resource both as a Helm hook and as a template (Helm v4
// sends both to a post-renderer): with HooksPassthrough the hook stays out
// of the overlay, and the two no longer meet.
type HookConflictError struct {
	// Resource is the resource's kind and name, with its namespace when set.
	Resource string
	Err      error
}

func (e *HookConflictError) Error() string {
	return e.Err.Error() + " (" + e.Resource + " is both a Helm hook and a template)"
}
func (e *HookConflictError) Unwrap() error { return e.Err }

// HookMode says what happens to Helm hook manifests (helm.sh/hook).
type HookMode string

const (
	// HooksKustomize sends hooks through the overlay like any manifest.
	HooksKustomize HookMode = "kustomize"
	// HooksPassthrough returns hooks untouched, after the other manifests.
	HooksPassthrough HookMode = "passthrough"
)

const helmHookAnnotation = "helm.sh/hook"

// Options configure Render.
type Options struct {
	// Overlay is the kustomization folder. Required.
	Overlay string
	// ResourceName is the file name under which the input is offered to the
	// overlay; its kustomization lists it in resources. Default: all.yaml,
	// the name the `cat > all.yaml; kustomize build` script uses.
	ResourceName string
	// Hooks says what happens to Helm hooks. Default: HooksKustomize.
	Hooks HookMode
	// ShardSize is the number of documents per group when the input is
	// split. Default: 64. Below 1, the input is never split.
	ShardSize int
	// Workers is how many groups are built at once. Default: GOMAXPROCS.
	Workers int
}

func (o *Options) setDefaults() {
	if o.ResourceName == "" {
		o.ResourceName = "all.yaml"
	}
	if o.Hooks == "" {
		o.Hooks = HooksKustomize
	}
	if o.ShardSize == 0 {
		o.ShardSize = 64
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
}

// Stats tells how a Render went, for logs and tests.
type Stats struct {
	Documents int
	Hooks     int // passed through untouched
	Shards    int // 1 when built once
	// Fallback says why the input was built once although the overlay
	// allowed splitting; empty when it was split or never could be.
	Fallback string
	// NotShardable says what in the overlay prevents splitting.
	NotShardable string
}

// Render applies the overlay to the manifests in input and returns the
// result, in the format of `kustomize build`.
func Render(ctx context.Context, opts Options, input []byte) ([]byte, Stats, error) {
	opts.setDefaults()
	var st Stats
	dir, err := filepath.Abs(opts.Overlay)
	if err != nil {
		return nil, st, fmt.Errorf("overlay %s: %w", opts.Overlay, err)
	}
	disk := newDisk()
	if !disk.IsDir(dir) {
		if disk.Exists(dir) {
			return nil, st, fmt.Errorf("overlay %s %w", opts.Overlay, ErrOverlayIsFile)
		}
		return nil, st, fmt.Errorf("%w: %s", ErrOverlayMissing, opts.Overlay)
	}
	// Kustomize's loader works in the folder with symbolic links resolved:
	// the in-memory manifests must be offered at that path.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, st, fmt.Errorf("overlay %s: %w", opts.Overlay, err)
	}
	k, kfile, err := readKustomization(disk, dir)
	if err != nil {
		return nil, st, err
	}
	if !lists(k, opts.ResourceName) {
		return nil, st, &OverlayError{File: kfile, Err: fmt.Errorf("%w: add %q to resources", ErrNotListed, opts.ResourceName)}
	}
	overlay := readOverlay(disk, dir, opts.ResourceName)
	if err := overlayAliasCycle(overlay); err != nil {
		return nil, st, err
	}

	docs, err := splitDocuments(input)
	if err != nil {
		return nil, st, err
	}
	if len(docs) == 0 {
		return nil, st, ErrEmptyInput
	}
	if err := parseAll(docs, opts.Workers); err != nil {
		return nil, st, err
	}
	docs = slices.DeleteFunc(docs, func(d doc) bool { return d.empty })
	if len(docs) == 0 {
		return nil, st, fmt.Errorf("%w: every document is empty", ErrEmptyInput)
	}
	var hooks []doc
	if opts.Hooks == HooksPassthrough {
		kept := docs[:0:0]
		for _, d := range docs {
			if d.hook {
				hooks = append(hooks, d)
			} else {
				kept = append(kept, d)
			}
		}
		docs = kept
	}
	st.Documents, st.Hooks = len(docs), len(hooks)

	var out []byte
	switch {
	case len(docs) == 0:
		// Only hooks: nothing for the overlay to do.
	default:
		out, err = build(ctx, opts, dir, k, overlay, docs, &st)
		if err != nil {
			if res := hookAndTemplate(docs); res != "" && strings.Contains(err.Error(), "already registered id") {
				err = &HookConflictError{Resource: res, Err: err}
			}
			return nil, st, err
		}
	}
	for _, h := range hooks {
		if len(out) > 0 {
			out = append(out, "---\n"...)
		}
		out = append(out, bytes.TrimLeft(h.raw, "\n")...)
		if !bytes.HasSuffix(out, []byte("\n")) {
			out = append(out, '\n')
		}
	}
	return out, st, nil
}

// hookAndTemplate returns a resource the documents hold both as a Helm hook
// and not, as Kustomize identifies resources, or "". It reads the documents'
// text again: it runs only after a failed build.
func hookAndTemplate(docs []doc) string {
	type named struct{ kind, name string }
	hooks := map[named]bool{}
	for _, d := range docs {
		if d.hook {
			hooks[named{d.kind, d.name}] = true
		}
	}
	if len(hooks) == 0 {
		return ""
	}
	var hookIDs, templateIDs []resid.ResId
	for _, d := range docs {
		if !hooks[named{d.kind, d.name}] {
			continue
		}
		n, err := yaml.Parse(string(d.raw))
		if err != nil {
			continue
		}
		group, version := resid.ParseGroupVersion(n.GetApiVersion())
		id := resid.NewResIdWithNamespace(resid.Gvk{Group: group, Version: version, Kind: d.kind}, d.name, n.GetNamespace())
		if d.hook {
			hookIDs = append(hookIDs, id)
		} else {
			templateIDs = append(templateIDs, id)
		}
	}
	for _, h := range hookIDs {
		for _, t := range templateIDs {
			if h.Equals(t) {
				if h.Namespace != "" {
					return h.Kind + " " + h.Namespace + "/" + h.Name
				}
				return h.Kind + " " + h.Name
			}
		}
	}
	return ""
}

// lists reports whether the kustomization lists the manifests file.
func lists(k *types.Kustomization, name string) bool {
	for _, r := range k.Resources {
		if filepath.Clean(r) == filepath.Clean(name) {
			return true
		}
	}
	return false
}

// parseAll parses every document, on several goroutines.
func parseAll(docs []doc, workers int) error {
	errs := make([]error, len(docs))
	var wg sync.WaitGroup
	per := (len(docs) + workers - 1) / workers
	for w := 0; w < len(docs); w += per {
		end := min(w+per, len(docs))
		wg.Go(func() {
			for i := w; i < end; i++ {
				errs[i] = docs[i].parse()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// build runs the overlay over docs, split into shards when that gives the
// same result. overlay is the overlay's own files, as readOverlay read them.
func build(ctx context.Context, opts Options, dir string, k *types.Kustomization, overlay []overlayText, docs []doc, st *Stats) ([]byte, error) {
	disk := newDisk()
	var plan splitPlan
	ok, why := shardable(disk, dir, k, 0, &plan)
	if !ok {
		st.NotShardable = why
	}
	if !ok || opts.ShardSize < 1 || len(docs) <= opts.ShardSize {
		st.Shards = 1
		return buildOnce(dir, opts.ResourceName, docs)
	}
	for _, d := range docs {
		if d.list {
			// The names inside a List do not take part in the grouping.
			st.Fallback, st.Shards = "the input holds a "+d.kind, 1
			return buildOnce(dir, opts.ResourceName, docs)
		}
	}

	// Documents strategic merge patches name without a target go into every
	// shard; so do the documents a replacement may read, with their groups.
	anchored := overlayValues(overlay)
	var anchors, rest []int
	for i, d := range docs {
		if anchored[d.name] {
			anchors = append(anchors, i)
		} else {
			rest = append(rest, i)
		}
	}
	restDocs := make([]doc, len(rest))
	for i, j := range rest {
		restDocs[i] = docs[j]
	}
	var split [][]int
	for _, g := range groups(restDocs) {
		if slices.ContainsFunc(g, func(i int) bool {
			return slices.ContainsFunc(plan.sources, func(sel resid.ResId) bool { return mayBeSource(sel, restDocs[i]) })
		}) {
			for _, i := range g {
				anchors = append(anchors, rest[i])
			}
			continue
		}
		split = append(split, g)
	}
	if len(anchors)*2 > len(docs) {
		// Each shard would build most of the input again.
		st.Fallback, st.Shards = fmt.Sprintf("%d of %d documents go into every shard", len(anchors), len(docs)), 1
		return buildOnce(dir, opts.ResourceName, docs)
	}
	var shards [][]int
	for _, s := range pack(split, opts.ShardSize) {
		shard := append([]int(nil), anchors...)
		for _, i := range s {
			shard = append(shard, rest[i])
		}
		sort.Ints(shard)
		shards = append(shards, shard)
	}
	if len(shards) < 2 {
		st.Shards = 1
		return buildOnce(dir, opts.ResourceName, docs)
	}
	forgetTrees(docs)

	out, why, err := buildSharded(ctx, opts, dir, k, docs, shards)
	if err != nil {
		return nil, err
	}
	if why != "" {
		st.Fallback, st.Shards = why, 1
		return buildOnce(dir, opts.ResourceName, docs)
	}
	st.Shards = len(shards)
	return out, nil
}

// joinDocs rebuilds a YAML stream from documents.
func joinDocs(docs []doc, idx []int) []byte {
	var b bytes.Buffer
	for n, i := range idx {
		if n > 0 {
			b.WriteString("---\n")
		}
		b.Write(docs[i].raw)
		// Only the input's last document can lack its newline, and it stays
		// last: a newline there would end a block scalar differently.
		if n < len(idx)-1 && !bytes.HasSuffix(docs[i].raw, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func allIndexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// forgetTrees lets go of the documents' parsed trees once the grouping is
// planned: the builds read the documents' text, and the trees, more than
// half of what stays in use for a big input, would only make the
// collector's heap goal, and so the memory taken from the system, about
// twice as large.
func forgetTrees(docs []doc) {
	for i := range docs {
		docs[i].node = nil
	}
}

// buildOnce is one `kustomize build` of the overlay over all documents.
func buildOnce(dir, resourceName string, docs []doc) ([]byte, error) {
	forgetTrees(docs)
	m, err := kustomize(dir, resourceName, joinDocs(docs, allIndexes(len(docs))))
	if err != nil {
		return nil, err
	}
	res, err := resources(m)
	if err != nil {
		return nil, err
	}
	return joinBuilt(res), nil
}

// kustomize builds the overlay with the manifests offered as resourceName,
// with the options of the `kustomize build` command.
func kustomize(dir, resourceName string, manifests []byte) (resmap.ResMap, error) {
	fs := newOverlayFS(filepath.Join(dir, resourceName), manifests)
	m, err := krusty.MakeKustomizer(cliOptions()).Run(fs, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m, nil
}

// cliOptions are the options `kustomize build` runs the library with when
// given no flags: the legacy output order unless the kustomization sets
// sortOptions, files only from inside the overlay, no plugins.
func cliOptions() *krusty.Options {
	o := krusty.MakeDefaultOptions()
	o.Reorder = krusty.ReorderOptionUnspecified
	return o
}

// built is one resource of a shard's result.
type built struct {
	id   resid.ResId
	yaml []byte
}

// buildSharded builds every shard and merges the results. It returns a
// reason, and no output, when the shards' results cannot be trusted to equal
// one build: a shard failed, or a resource built in several shards (an extra
// resource, a generated one, an anchor) came out differently in two of them.
func buildSharded(ctx context.Context, opts Options, dir string, k *types.Kustomization, docs []doc, shards [][]int) ([]byte, string, error) {
	results := make([][]built, len(shards))
	errs := make([]error, len(shards))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(opts.Workers, len(shards)) {
		wg.Go(func() {
			for s := range work {
				m, err := kustomize(dir, opts.ResourceName, joinDocs(docs, shards[s]))
				if err != nil {
					errs[s] = err
					continue
				}
				results[s], errs[s] = resources(m)
			}
		})
	}
	for s := range shards {
		if ctx.Err() != nil {
			break
		}
		work <- s
	}
	close(work)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	for s, err := range errs {
		if err != nil {
			return nil, fmt.Sprintf("shard %d of %d failed", s+1, len(shards)), nil
		}
	}

	// Merge: a resource that comes out of several shards must come out of
	// all of them, identical; it is kept once.
	type seen struct {
		count int
		yaml  []byte
	}
	byID := map[resid.ResId]*seen{}
	var merged []built
	for _, res := range results {
		for _, r := range res {
			if s, ok := byID[r.id]; ok {
				if !bytes.Equal(s.yaml, r.yaml) {
					return nil, "a resource built in several shards differs: " + r.id.String(), nil
				}
				s.count++
				continue
			}
			byID[r.id] = &seen{count: 1, yaml: r.yaml}
			merged = append(merged, r)
		}
	}
	for id, s := range byID {
		if s.count != 1 && s.count != len(shards) {
			return nil, "a resource came out of some shards only: " + id.String(), nil
		}
	}
	// Each of Helm's documents is one resource (Lists are never split), and
	// the overlay adds the same number to every shard. Anything else means
	// two documents became one resource, an id conflict a single build
	// reports (say, two Namespaces both renamed by the namespace field).
	extra := len(results[0]) - len(shards[0])
	for s, res := range results {
		if len(res)-len(shards[s]) != extra {
			return nil, fmt.Sprintf("shard %d of %d made %d resources of %d documents", s+1, len(shards), len(res), len(shards[s])), nil
		}
	}
	if len(merged) != extra+len(docs) {
		return nil, fmt.Sprintf("the shards made %d resources of %d documents", len(merged), len(docs)), nil
	}

	less, err := legacyOrder(k, merged)
	if err != nil {
		return nil, "", err
	}
	sort.SliceStable(merged, func(i, j int) bool { return less(merged[i].id, merged[j].id) })
	return joinBuilt(merged), "", nil
}

// joinBuilt writes resources as one stream, as `kustomize build` does.
func joinBuilt(res []built) []byte {
	var b bytes.Buffer
	for i, r := range res {
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(r.yaml)
	}
	return b.Bytes()
}

// resources lists a build's resources with their ids and YAML.
func resources(m resmap.ResMap) ([]built, error) {
	out := make([]built, 0, m.Size())
	for _, r := range m.Resources() {
		y, err := resourceYAML(r)
		if err != nil {
			return nil, fmt.Errorf("writing %s: %w", r.CurId(), err)
		}
		out = append(out, built{id: r.CurId(), yaml: y})
	}
	return out, nil
}

// legacyOrder returns the order Kustomize's legacy sort puts resources in.
// Kinds are ranked by the library's own sort transformer, run over one stand-in
// resource per kind (with the kustomization's sortOptions, if any); within a
// kind, resources are ordered by namespace and name as that transformer
// orders them.
func legacyOrder(k *types.Kustomization, res []built) (func(a, b resid.ResId) bool, error) {
	opts := &types.SortOptions{Order: types.LegacySortOrder}
	if k.SortOptions != nil {
		opts = k.SortOptions
	}
	var gvks []resid.Gvk
	seen := map[resid.Gvk]bool{}
	for _, r := range res {
		if !seen[r.id.Gvk] {
			seen[r.id.Gvk] = true
			gvks = append(gvks, r.id.Gvk)
		}
	}
	// The library's sort, run as `kustomize build` runs it, over one stand-in
	// resource per kind.
	var stubs bytes.Buffer
	for i, g := range gvks {
		fmt.Fprintf(&stubs, "---\napiVersion: %s\nkind: %s\nmetadata:\n  name: stub-%d\n", g.ApiVersion(), g.Kind, i)
	}
	kust := types.Kustomization{Resources: []string{"stubs.yaml"}, SortOptions: opts}
	kb, err := yaml.Marshal(kust)
	if err != nil {
		return nil, fmt.Errorf("ranking kinds: %w", err)
	}
	mem := filesys.MakeFsInMemory()
	if err := mem.WriteFile("/rank/kustomization.yaml", kb); err != nil {
		return nil, fmt.Errorf("ranking kinds: %w", err)
	}
	if err := mem.WriteFile("/rank/stubs.yaml", stubs.Bytes()); err != nil {
		return nil, fmt.Errorf("ranking kinds: %w", err)
	}
	m, err := krusty.MakeKustomizer(cliOptions()).Run(mem, "/rank")
	if err != nil {
		return nil, fmt.Errorf("ranking kinds: %w", err)
	}
	rank := map[resid.Gvk]int{}
	for i, r := range m.Resources() {
		rank[r.GetGvk()] = i
	}
	return func(a, b resid.ResId) bool {
		if a.Gvk != b.Gvk {
			return rank[a.Gvk] < rank[b.Gvk]
		}
		return sortKey(a) < sortKey(b)
	}, nil
}

// sortKey is the within-kind part of Kustomize's legacy sort key.
func sortKey(id resid.ResId) string {
	ns, name := id.Namespace, id.Name
	if ns == "" {
		ns = "~X"
	}
	if name == "" {
		name = "~N"
	}
	return ns + "|" + name
}

package render

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/resid"
	"sigs.k8s.io/kustomize/kyaml/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// kustomizationFile finds the kustomization file of dir.
func kustomizationFile(fs filesys.FileSystem, dir string) (string, error) {
	for _, n := range konfig.RecognizedKustomizationFileNames() {
		p := filepath.Join(dir, n)
		if fs.Exists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w in %s (looked for %v)", ErrNoKustomization, dir, konfig.RecognizedKustomizationFileNames())
}

// readKustomization reads and decodes the kustomization file of dir.
func readKustomization(fs filesys.FileSystem, dir string) (*types.Kustomization, string, error) {
	path, err := kustomizationFile(fs, dir)
	if err != nil {
		return nil, "", err
	}
	b, err := fs.ReadFile(path)
	if err != nil {
		return nil, path, fmt.Errorf("reading %s: %w", path, err)
	}
	var k types.Kustomization
	if err := k.Unmarshal(b); err != nil {
		return nil, path, &OverlayError{File: path, Err: err}
	}
	// As Kustomize's loader: deprecated fields (bases, imageTags) move to
	// their successors.
	k.FixKustomization()
	return &k, path, nil
}

// fieldCheck looks further at one field of a kustomization that is set, and
// returns why it makes the overlay's result depend on more than one
// document, or "" when it does not. plan gathers what the checks find that
// the split must honour (the replacements' sources).
type fieldCheck func(fs filesys.FileSystem, dir string, k *types.Kustomization, depth int, p *splitPlan) string

// splitPlan is what the kustomization checks find that the split must
// honour.
type splitPlan struct {
	// sources select the documents a replacement may read: each of them is
	// built in every shard, with the documents it refers to, so that every
	// shard reads the same values.
	sources []resid.ResId
}

// perDocumentFields are the kustomization fields whose effect on one of
// Helm's documents depends on that document alone, on the documents it
// refers to by name (kept in one shard, see groups), and on the overlay's
// own files (whose named documents go into every shard), each with the
// check its value still needs, nil when none. Every field of
// types.Kustomization is in exactly one of perDocumentFields and
// crossDocumentFields (TestKustomizationFieldsClassified); a field neither
// lists, from a newer library, makes an overlay that sets it build once.
func perDocumentFields() map[string]fieldCheck {
	return map[string]fieldCheck{
		"TypeMeta":          nil, // Kustomization or Component
		"MetaData":          nil, // the kustomization's own name
		"NamePrefix":        nil, // names, and references within a shard's groups
		"NameSuffix":        nil,
		"Namespace":         nil, // Namespaces stay in one shard (see groups)
		"CommonLabels":      nil,
		"Labels":            nil,
		"CommonAnnotations": nil, // values are anchors: documents they name go into every shard
		// Strategic merge patches name their resource; it goes into every shard.
		"PatchesStrategicMerge": nil,
		"PatchesJson6902":       checkPatches,
		"Patches":               checkPatches,
		"Images":                nil,
		"ImageTags":             nil, // moved into Images by FixKustomization
		"Replicas":              nil, // the named resource goes into every shard
		// A replacement writes into each target what it reads from one
		// source: the documents any source selector may pick are built in
		// every shard (see splitPlan).
		"Replacements":       checkReplacements,
		"SortOptions":        checkSortOptions,
		"Resources":          checkResources,
		"Components":         checkComponents,
		"Bases":              nil, // moved into Resources by FixKustomization
		"ConfigMapGenerator": nil, // generated in every shard, kept once
		"SecretGenerator":    nil,
		"GeneratorOptions":   nil,
		"BuildMetadata":      nil, // annotations and labels of each resource
	}
}

// crossDocumentFields are the kustomization fields that make the result for
// one document depend on others the split does not follow, with the reason
// Stats.NotShardable gives.
func crossDocumentFields() map[string]string {
	return map[string]string{
		"OpenAPI":                     "openapi",
		"Vars":                        "vars",
		"Crds":                        "crds",
		"HelmGlobals":                 "helmCharts",
		"HelmCharts":                  "helmCharts",
		"HelmChartInflationGenerator": "helmCharts",
		"Configurations":              "configurations",
		"Generators":                  "generator, transformer or validator plugins",
		"Transformers":                "generator, transformer or validator plugins",
		"Validators":                  "generator, transformer or validator plugins",
	}
}

// shardable reports whether the overlay's result is the same when Helm's
// documents are split into independent groups, each built with the whole
// overlay, and the groups' results merged. It decides by the fields the
// kustomization sets, its components' and its bases': each must be one of
// perDocumentFields and pass that field's check. What the split must honour
// (the replacements' sources) is added to p.
func shardable(fs filesys.FileSystem, dir string, k *types.Kustomization, depth int, p *splitPlan) (bool, string) {
	return shardableBy(perDocumentFields(), crossDocumentFields(), fs, dir, k, depth, p)
}

// shardableBy is shardable with the lists of fields given.
func shardableBy(per map[string]fieldCheck, cross map[string]string, fs filesys.FileSystem, dir string, k *types.Kustomization, depth int, p *splitPlan) (bool, string) {
	if depth > 8 {
		return false, "components nested too deep"
	}
	v := reflect.ValueOf(k).Elem()
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if !isSet(v.Field(i)) {
			continue
		}
		if why, ok := cross[name]; ok {
			return false, why
		}
		check, ok := per[name]
		if !ok {
			return false, "the kustomization field " + name + ", which this version does not know"
		}
		if check == nil {
			continue
		}
		if why := check(fs, dir, k, depth, p); why != "" {
			return false, why
		}
	}
	return true, ""
}

// isSet reports whether a kustomization field holds anything: an empty
// list or map sets nothing, as Kustomize reads it.
func isSet(f reflect.Value) bool {
	switch f.Kind() {
	case reflect.Slice, reflect.Map:
		return f.Len() > 0
	default:
		return !f.IsZero()
	}
}

// checkSortOptions: only the legacy order is rebuilt after the merge.
func checkSortOptions(_ filesys.FileSystem, _ string, k *types.Kustomization, _ int, _ *splitPlan) string {
	if k.SortOptions.Order != types.LegacySortOrder {
		return "sortOptions other than legacy"
	}
	return ""
}

// checkPatches: a patch that renames a resource (or changes its kind) makes
// references to the new name, which the grouping cannot see.
func checkPatches(fs filesys.FileSystem, dir string, k *types.Kustomization, _ int, _ *splitPlan) string {
	for _, p := range append(slices.Clone(k.Patches), k.PatchesJson6902...) { //nolint:staticcheck // deprecated, yet kustomize build still honours it
		if p.Options != nil && (p.Options.AllowNameChange || p.Options.AllowKindChange) {
			return "a patch that may rename resources"
		}
		text := p.Patch
		if p.Path != "" {
			b, err := readWithin(fs, dir, p.Path)
			if err != nil {
				return "patch " + p.Path + " unreadable"
			}
			text = string(b)
		}
		if renames(text) {
			return "a JSON 6902 patch that renames resources"
		}
	}
	return ""
}

// checkReplacements adds the replacements' source selectors to p, reading
// those kept in files as the library reads them (a list, or one).
func checkReplacements(fs filesys.FileSystem, dir string, k *types.Kustomization, _ int, p *splitPlan) string {
	for _, r := range k.Replacements {
		list := []types.Replacement{r.Replacement}
		if r.Path != "" {
			b, err := readWithin(fs, dir, r.Path)
			if err != nil {
				return "replacements " + r.Path + " unreadable"
			}
			if list = nil; sigsyaml.Unmarshal(b, &list) != nil {
				var one types.Replacement
				if err := sigsyaml.Unmarshal(b, &one); err != nil {
					return "replacements " + r.Path + " unreadable"
				}
				list = []types.Replacement{one}
			}
		}
		for _, rr := range list {
			if rr.Source != nil {
				p.sources = append(p.sources, rr.Source.ResId)
			}
		}
	}
	return ""
}

// readWithin reads the file at rel in dir, only if it is inside dir once
// symbolic links are resolved: Kustomize refuses any other, before reading it.
func readWithin(fs filesys.FileSystem, dir, rel string) ([]byte, error) {
	f := filepath.Join(dir, rel)
	if !within(dir, f) {
		return nil, fmt.Errorf("%s is not inside %s", rel, dir)
	}
	return fs.ReadFile(f)
}

// checkResources: a base's own kustomization can carry settings
// (configurations, crds, vars) that Kustomize applies to the whole build.
func checkResources(fs filesys.FileSystem, dir string, k *types.Kustomization, depth int, p *splitPlan) string {
	for _, r := range k.Resources {
		rdir := filepath.Join(dir, r)
		if strings.Contains(r, "://") || strings.HasPrefix(r, "github.com/") {
			return "remote resource " + r
		}
		if !fs.IsDir(rdir) {
			continue
		}
		bk, _, err := readKustomization(fs, rdir)
		if err != nil {
			return "resource " + r + " unreadable"
		}
		if ok, why := shardable(fs, rdir, bk, depth+1, p); !ok {
			return "resource " + r + ": " + why
		}
	}
	return ""
}

// checkComponents: a component's fields apply to the whole build.
func checkComponents(fs filesys.FileSystem, dir string, k *types.Kustomization, depth int, p *splitPlan) string {
	for _, c := range k.Components {
		cdir := filepath.Join(dir, c)
		if !fs.IsDir(cdir) {
			return "component " + c + " is not a folder"
		}
		ck, _, err := readKustomization(fs, cdir)
		if err != nil {
			return "component " + c + " unreadable"
		}
		if ok, why := shardable(fs, cdir, ck, depth+1, p); !ok {
			return "component " + c + ": " + why
		}
	}
	return ""
}

// mayBeSource reports whether a replacement's source selector may pick the
// document, by its kind and name: a superset of what the library's selector
// picks in a shardable overlay, which changes no kind, and whose names
// after the build hold the document's own (prefixes and suffixes added).
func mayBeSource(sel resid.ResId, d doc) bool {
	return (sel.Kind == "" || sel.Kind == d.kind) && (sel.Name == "" || strings.Contains(sel.Name, d.name))
}

// renames reports whether a patch is a JSON 6902 patch with an operation
// on a resource's name, its kind, or its whole metadata.
func renames(text string) bool {
	n, err := yaml.Parse(text)
	if err != nil || n.YNode().Kind != yaml.SequenceNode {
		return false
	}
	for _, op := range n.YNode().Content {
		if op.Kind != yaml.MappingNode {
			continue
		}
		for i := 0; i+1 < len(op.Content); i += 2 {
			if k := op.Content[i].Value; k != "path" && k != "from" {
				continue
			}
			switch p := op.Content[i+1].Value; {
			case p == "", p == "/", p == "/metadata", p == "/kind",
				p == "/metadata/name", strings.HasPrefix(p, "/metadata/name/"):
				return true
			}
		}
	}
	return false
}

// overlayText is one YAML text of the overlay's own files, read and parsed
// once for every use below.
type overlayText struct {
	file   string // the file it comes from
	inline bool   // a patch written inside the kustomization
	// docs are its documents, none when one is not YAML (Kustomize reports
	// that itself).
	docs []overlayDoc
}

type overlayDoc struct {
	line int // first line in the text, from 1
	node *yaml.RNode
}

// readOverlay reads and parses every YAML text of the overlay's own files:
// its kustomization, the patches (files and inline) and resource files it
// lists, and those of its components and bases. Helm's manifests
// (resourceName) are not among them.
func readOverlay(fs filesys.FileSystem, dir, resourceName string) []overlayText {
	var out []overlayText
	walkOverlay(fs, dir, resourceName, func(file, text string, inline bool) {
		t := overlayText{file: file, inline: inline}
		if docs, err := splitDocuments([]byte(text)); err == nil {
			for _, d := range docs {
				n, err := yaml.Parse(string(d.raw))
				if err != nil {
					t.docs = nil
					break
				}
				t.docs = append(t.docs, overlayDoc{line: d.line, node: n})
			}
		}
		out = append(out, t)
	}, 0)
	return out
}

// overlayValues returns every scalar value in the overlay's own files.
// Resources with one of these names go into every group: an untargeted
// strategic merge patch or a replicas entry fails when its resource is
// missing, and a value the overlay writes into Helm's documents (a patch's
// serviceAccountName, a commonAnnotations value) may be a reference
// Kustomize follows, which the grouping of Helm's documents alone cannot see.
func overlayValues(texts []overlayText) map[string]bool {
	values := map[string]bool{}
	for _, t := range texts {
		for _, d := range t.docs {
			scalars(d.node.YNode(), nil, func(v string) { values[v] = true })
		}
	}
	return values
}

// overlayAliasCycle returns an error naming the overlay file that holds an
// alias inside its own anchor (Kustomize's reader would expand it until the
// stack overflows), or aliases that expand past checkAliasing's bounds.
func overlayAliasCycle(texts []overlayText) error {
	for _, t := range texts {
		for _, d := range t.docs {
			where := fmt.Sprintf("line %d", d.line)
			if t.inline {
				where += " of an inline patch"
			}
			if a := aliasCycle(d.node.YNode()); a != nil {
				where = fmt.Sprintf("line %d", d.line+a.Line-1)
				if t.inline {
					where += " of an inline patch"
				}
				return &OverlayError{File: t.file, Err: fmt.Errorf("alias *%s on %s is inside the anchor it refers to", a.Value, where)}
			}
			if err := checkAliasing(d.node.YNode()); err != nil {
				return &OverlayError{File: t.file, Err: fmt.Errorf("the document from %s: %w", where, err)}
			}
		}
	}
	return nil
}

// walkOverlay calls fn with every YAML text of the overlay's own files (see
// readOverlay), the file each comes from, and whether it is a patch
// written inside the kustomization.
func walkOverlay(fs filesys.FileSystem, dir, resourceName string, fn func(file, text string, inline bool), depth int) {
	if depth > 8 {
		return
	}
	k, path, err := readKustomization(fs, dir)
	if err != nil {
		return
	}
	read := func(p string) {
		f := filepath.Join(dir, p)
		if !within(dir, f) {
			// Kustomize refuses a file outside its kustomization's folder
			// (symbolic links resolved); it is not read before that.
			return
		}
		if b, err := fs.ReadFile(f); err == nil {
			fn(f, string(b), false)
		}
	}
	read(filepath.Base(path))
	for _, p := range append(slices.Clone(k.Patches), k.PatchesJson6902...) { //nolint:staticcheck // deprecated, yet kustomize build still honours it
		if p.Path != "" {
			read(p.Path)
		}
		if p.Patch != "" {
			fn(path, p.Patch, true)
		}
	}
	for _, p := range k.PatchesStrategicMerge { //nolint:staticcheck // deprecated, yet kustomize build still honours it
		if s := string(p); fs.Exists(filepath.Join(dir, s)) {
			read(s)
		} else {
			fn(path, s, true)
		}
	}
	for _, r := range k.Resources {
		rdir := filepath.Join(dir, r)
		switch {
		case depth == 0 && filepath.Clean(r) == filepath.Clean(resourceName):
			// Helm's manifests.
		case fs.IsDir(rdir):
			walkOverlay(fs, rdir, resourceName, fn, depth+1)
		case fs.Exists(rdir):
			read(r)
		}
	}
	for _, c := range k.Components {
		walkOverlay(fs, filepath.Join(dir, c), resourceName, fn, depth+1)
	}
}

// skippedKeys are fields whose values never name another resource in
// Kustomize's name references, so they do not tie documents together
// (TestSkippedKeysAreNotNameReferences checks them against Kustomize's own
// list). Annotations are not among them: Kustomize follows some
// (nginx.ingress.kubernetes.io/auth-secret and others).
var skippedKeys = map[string]bool{
	"labels": true, "selector": true, "matchLabels": true,
	"matchExpressions": true, "nodeSelector": true, "image": true, "command": true,
	"args": true, "value": true, "data": true, "stringData": true, "binaryData": true,
}

// scalars calls fn with every scalar value of n, leaving out the values of
// the keys in skip. Aliases are followed, as Kustomize resolves them before
// it follows references; depth bounds an alias to its own ancestor.
func scalars(n *yaml.Node, skip map[string]bool, fn func(string)) {
	var walk func(n *yaml.Node, depth int)
	walk = func(n *yaml.Node, depth int) {
		if n == nil || depth > 64 {
			return
		}
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, depth+1)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if !skip[n.Content[i].Value] {
					walk(n.Content[i+1], depth+1)
				}
			}
		case yaml.ScalarNode:
			fn(n.Value)
		case yaml.AliasNode:
			walk(n.Alias, depth+1)
		}
	}
	walk(n, 0)
}

// groups partitions the documents so that a document and any document it may
// refer to by name land in the same group: Kustomize's name reference fix-ups
// (after a prefix, a suffix, a generated name or a namespace change) then see
// both. A reference is any scalar of the referrer, outside skippedKeys,
// equal to another document's name: a superset of the fields Kustomize
// follows. Documents that share a name are grouped too,
// so an id conflict is reported as a single build would. It returns, for
// each group, the indexes of its documents in input order.
func groups(docs []doc) [][]int {
	parent := make([]int, len(docs))
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	union := func(a, b int) {
		if ra, rb := find(a), find(b); ra != rb {
			parent[rb] = ra
		}
	}
	byName := map[string]int{}
	firstNamespace := -1
	for i, d := range docs {
		if d.kind == "Namespace" {
			// The namespace field renames Namespaces: two of them may
			// become one id, which a single build reports.
			if firstNamespace < 0 {
				firstNamespace = i
			} else {
				union(i, firstNamespace)
			}
		}
		if d.name == "" {
			continue
		}
		if j, ok := byName[d.name]; ok {
			union(i, j)
		} else {
			byName[d.name] = i
		}
	}
	for i, d := range docs {
		spec := d.node.YNode()
		for j := 0; j+1 < len(spec.Content); j += 2 {
			if spec.Content[j].Value == "metadata" {
				// metadata.name is the document's own; ownerReferences may name others.
				for _, m := range fieldsExcept(spec.Content[j+1], "name", "namespace") {
					scalars(m, skippedKeys, func(v string) {
						if k, ok := byName[v]; ok {
							union(i, k)
						}
					})
				}
				continue
			}
			if skippedKeys[spec.Content[j].Value] {
				continue
			}
			scalars(spec.Content[j+1], skippedKeys, func(v string) {
				if k, ok := byName[v]; ok {
					union(i, k)
				}
			})
		}
	}
	index := map[int]int{}
	var out [][]int
	for i := range docs {
		r := find(i)
		g, ok := index[r]
		if !ok {
			g = len(out)
			index[r] = g
			out = append(out, nil)
		}
		out[g] = append(out[g], i)
	}
	return out
}

// fieldsExcept returns the values of mapping n other than the named keys
// and skippedKeys.
func fieldsExcept(n *yaml.Node, keys ...string) []*yaml.Node {
	var out []*yaml.Node
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i].Value
		if slices.Contains(keys, k) || skippedKeys[k] {
			continue
		}
		out = append(out, n.Content[i+1])
	}
	return out
}

// pack gathers groups into shards of at most about size documents each,
// as many as that takes and of even sizes (200 documents by 64 make four
// shards of 50, not three of 64 and one of 8, which would leave a worker
// idle), keeping the input order inside each shard.
func pack(groups [][]int, size int) [][]int {
	total := 0
	for _, g := range groups {
		total += len(g)
	}
	if n := (total + size - 1) / size; n > 0 {
		size = (total + n - 1) / n
	}
	var shards [][]int
	var cur []int
	for _, g := range groups {
		if len(cur) > 0 && len(cur)+len(g) > size {
			slices.Sort(cur)
			shards = append(shards, cur)
			cur = nil
		}
		cur = append(cur, g...)
	}
	if len(cur) > 0 {
		slices.Sort(cur)
		shards = append(shards, cur)
	}
	return shards
}

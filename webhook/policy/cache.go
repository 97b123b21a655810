package policy

import (
	"crypto/sha256"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"
)

// Runner pods are highly repetitive: one platform template, many tasks.
// Two pods that differ only where the policies never look (a task id label,
// a generated name) get the same decision. inputReads finds, from the
// policies' syntax, every part of the input they can read; the decision is
// cached under a hash of those parts only. A policy whose reads cannot be
// bounded, or that calls a built-in not known to be pure (builtins.go:
// time, rand, x509 verification, and any built-in OPA adds until it is
// reviewed), turns the cache off, so a cached decision is always the
// decision the policies would have made.

// inputReads returns the input paths the modules read, each as a list of
// keys, or ok=false when a read covers the whole input or a built-in is not
// in pureBuiltins.
func inputReads(modules map[string]*ast.Module) (paths [][]string, ok bool) {
	ok = true
	seen := map[string]bool{}
	add := func(p []string) {
		if len(p) == 0 {
			ok = false
			return
		}
		k := pathKey(p)
		if !seen[k] {
			seen[k] = true
			paths = append(paths, p)
		}
	}
	if shadowsBuiltins(modules) {
		return nil, false
	}
	aliases := inputAliases(modules)
	// An alias is undefined where the object its object.get reads is
	// missing, and its default where that object lacks the key.
	for _, a := range aliases {
		for _, b := range a.bases {
			add(existsRead(b))
		}
	}
	for name, m := range modules {
		if strings.HasSuffix(name, "_test.rego") {
			continue
		}
		// object.get(<input ref>, <constant key or path>, default) reads the
		// input ref extended by the key; the bare ref is not read otherwise.
		handled := map[*ast.Term]bool{}
		// An alias's own definition reads nothing by itself: its uses do.
		for _, a := range aliases {
			if a.module == name {
				a.markDefinition(handled)
			}
		}
		// Lists iterated element by element, the elements' fields read by
		// name (elements.go): each field read through its elements.
		for _, r := range m.Rules {
			elementReads(m, r, aliases, handled, add)
		}
		for _, a := range aliases {
			aliasReads(m, a, add, handled)
		}
		// A builtin is called in two forms: as a term (x := time.now_ns())
		// and as a statement whose last argument is the output
		// (time.now_ns(x), http.send(req, resp)); the second is an
		// expression whose first term is the operator, not an ast.Call.
		walkExprs(m, func(e *ast.Expr) bool {
			if e.IsCall() && uncacheable(e.Operator().String()) {
				ok = false
			}
			// A function or built-in replaced with `with` (object.get as
			// f) changes what the reads found in the syntax mean.
			// A function mocked with a built-in that is not pure (with
			// data.p.f as uuid.rfc4122) calls it where no call of it shows.
			for _, w := range e.With {
				if ref, isRef := w.Target.Value.(ast.Ref); !isRef || !ref[0].Equal(ast.InputRootDocument) && !ref[0].Equal(ast.DefaultRootDocument) {
					ok = false
				}
				switch w.Value.Value.(type) {
				case ast.Ref, ast.Var:
					if uncacheable(w.Value.Value.String()) {
						ok = false
					}
				}
			}
			return false
		})
		walkTerms(m, func(t *ast.Term) bool {
			call, isCall := t.Value.(ast.Call)
			if !isCall || len(call) == 0 {
				return false
			}
			fn := call[0].Value.String()
			if uncacheable(fn) {
				ok = false
			}
			if base, path, isGet := objectGetOfInput(call); isGet && !handled[call[1]] {
				add(path)
				if e := existsRead(base); e != nil {
					add(e)
				}
				handled[call[1]] = true
			}
			return false
		})
		walkTerms(m, func(t *ast.Term) bool {
			if handled[t] {
				return false
			}
			if p, isInput := groundInputPrefix(t); isInput {
				add(p)
			}
			return false
		})
	}
	return coveringPaths(paths), ok
}

// shadowsBuiltins reports whether a module defines, or imports, a name
// that a built-in's name starts with (object, array, time, ...): a call
// such as object.get(...) then calls the policies' own function, and what
// the analysis reads from the syntax of a built-in's call does not hold.
func shadowsBuiltins(modules map[string]*ast.Module) bool {
	roots := map[string]bool{}
	for name := range ast.BuiltinMap {
		if root, _, dotted := strings.Cut(name, "."); dotted {
			roots[root] = true
		}
	}
	for file, m := range modules {
		if strings.HasSuffix(file, "_test.rego") {
			continue
		}
		for _, r := range m.Rules {
			if ref := r.Head.Ref(); len(ref) > 0 && roots[strings.Trim(ref[0].String(), `"`)] {
				return true
			}
		}
		for _, imp := range m.Imports {
			if roots[string(imp.Name())] {
				return true
			}
		}
	}
	return false
}

// pathKey is a path as one string, distinct for distinct paths whatever
// their keys hold.
func pathKey(p []string) string {
	var b []byte
	for _, k := range p {
		b = strconv.AppendInt(b, int64(len(k)), 10)
		b = append(append(b, ':'), k...)
	}
	return string(b)
}

// walkTerms is ast.WalkTerms over a module or a rule, the rules' head
// references included: ast.WalkTerms leaves out the terms of a head such
// as p[input.x] := ... or p[c.name].f := ..., which read what they name.
func walkTerms(x any, f func(*ast.Term) bool) {
	ast.WalkTerms(x, f)
	for _, r := range headRefs(x) {
		ast.WalkTerms(r, f)
	}
}

// walkExprs is ast.WalkExprs over a module or a rule, the expressions of
// comprehensions in the rules' head references included.
func walkExprs(x any, f func(*ast.Expr) bool) {
	ast.WalkExprs(x, f)
	for _, r := range headRefs(x) {
		ast.WalkExprs(r, f)
	}
}

// headRefs are the head references of a module's or a rule's rules (else
// branches included), past their names.
func headRefs(x any) []ast.Ref {
	var rules []*ast.Rule
	switch x := x.(type) {
	case *ast.Module:
		rules = x.Rules
	case *ast.Rule:
		rules = []*ast.Rule{x}
	}
	var out []ast.Ref
	for _, r := range rules {
		for ; r != nil; r = r.Else {
			if len(r.Head.Reference) > 1 {
				out = append(out, r.Head.Reference[1:])
			}
		}
	}
	return out
}

// coveringPaths leaves out each path below another one: reading "config"
// covers "config.mode".
func coveringPaths(paths [][]string) [][]string {
	return slices.DeleteFunc(slices.Clone(paths), func(p []string) bool {
		return slices.ContainsFunc(paths, func(q []string) bool { return len(q) < len(p) && slices.Equal(q, p[:len(q)]) })
	})
}

// inputAlias is a rule that names one part of the input and nothing else,
// `name := object.get(input, <constant path>, <constant default>)`, defined
// once in its package: a policy that reads name["key"] reads the input at
// path.key, not the whole part. Without this, a rule such as
// `pod_annotations_in := object.get(input, ["pod", "metadata",
// "annotations"], {})` would put every pod annotation, the task's own
// (runwarden.dev/task-id) among them, in the cache key, and no two runner
// pods would share a decision.
//
// A list alias names the concatenation of such lists,
// `name := array.concat(<list>, <list>)`, each an input path (a reference
// or object.get as above) or another alias: its paths are theirs, and a
// policy that iterates it reads each of them element by element
// (elements.go).
type inputAlias struct {
	module string     // the file that defines it
	def    *ast.Rule  // its definition
	pkg    ast.Ref    // its package, data.<package>
	name   ast.Var    // its name in its package
	full   ast.Ref    // data.<package>.<name>
	paths  [][]string // the input paths it names: one, or a list alias's
	bases  [][]string // the objects its object.get calls read from, the input itself left out
	list   bool       // a list alias
	// byKey: its default is {}, so a key read through it reads the same
	// whether the part is missing or there without that key; with any
	// other default the two differ, and a use by key reads the part whole.
	byKey bool
}

// markDefinition marks what the alias's definition refers to as read
// through the alias: its uses say what is read.
func (a inputAlias) markDefinition(handled map[*ast.Term]bool) {
	if !a.list {
		handled[a.def.Head.Value.Value.(ast.Call)[1]] = true
		return
	}
	ast.WalkTerms(a.def.Head.Value, func(t *ast.Term) bool {
		handled[t] = true
		return false
	})
}

// inputAliases finds the input aliases of the modules (tests left out).
func inputAliases(modules map[string]*ast.Module) []inputAlias {
	defs := map[string]int{} // rules per data.<package>.<name>, any kind
	var out []inputAlias
	for file, m := range modules {
		if strings.HasSuffix(file, "_test.rego") {
			continue
		}
		for _, r := range m.Rules {
			ref := r.Head.Ref()
			if len(ref) == 0 {
				continue
			}
			name, isVar := ref[0].Value.(ast.Var)
			if !isVar {
				continue
			}
			full := m.Package.Path.Append(ast.StringTerm(string(name)))
			defs[full.String()]++
			if len(ref) != 1 || r.Default || r.Else != nil || len(r.Head.Args) > 0 || r.Head.Key != nil || r.Head.Value == nil {
				continue
			}
			if len(r.Body) != 1 || !r.Body[0].Equal(ast.NewExpr(ast.BooleanTerm(true))) {
				continue
			}
			call, isCall := r.Head.Value.Value.(ast.Call)
			if !isCall || len(call) != 4 || !ast.IsConstant(call[3].Value) {
				continue
			}
			base, path, isGet := objectGetOfInput(call)
			if !isGet {
				continue
			}
			a := inputAlias{
				module: file, def: r, pkg: m.Package.Path, name: name, full: full, paths: [][]string{path},
				byKey: call[3].Value.Compare(ast.NewObject()) == 0,
			}
			if len(base) > 0 {
				a.bases = [][]string{base}
			}
			out = append(out, a)
		}
	}
	// A name defined by more than one rule (an else, a default, another
	// file) is not an alias.
	out = slices.DeleteFunc(out, func(a inputAlias) bool { return defs[a.full.String()] != 1 })
	return append(out, listAliases(modules, defs, out)...)
}

// aliasReads adds the input paths module m reads through alias a: the
// alias's path extended by the constant keys of a["key"] or
// object.get(a, <constant key or path>, default); any other use (the alias
// whole, a dynamic key, a reference to its package that may reach it)
// reads the whole path.
func aliasReads(m *ast.Module, a inputAlias, add func([]string), done map[*ast.Term]bool) {
	samePackage := m.Package.Path.Equal(a.pkg)
	// isAlias reports whether t names the alias: its name in its own
	// package, data.<package>.<name> anywhere.
	isAlias := func(t *ast.Term) bool {
		if v, isVar := t.Value.(ast.Var); isVar {
			return samePackage && v.Equal(a.name)
		}
		ref, isRef := t.Value.(ast.Ref)
		return isRef && ref.Equal(a.full)
	}
	addAll := func(keys []string) {
		if !a.byKey {
			keys = nil
		}
		for _, p := range a.paths {
			add(append(slices.Clone(p), keys...))
		}
	}
	full := constantKeys(a.full[1:]) // the alias's path below data
	handled := map[*ast.Term]bool{}
	visit := func(t *ast.Term) bool {
		if handled[t] || done[t] {
			return false
		}
		switch v := t.Value.(type) {
		case ast.Call:
			if len(v) == 4 && v[0].Value.String() == "object.get" && isAlias(v[1]) {
				if key, constant := constantPath(v[2]); constant {
					addAll(key)
					handled[v[1]] = true
				}
			}
		case ast.Ref:
			if samePackage && isAlias(v[0]) {
				if keys := constantKeys(v[1:]); len(keys) > 0 {
					addAll(keys)
					handled[v[0]] = true
				}
				return false
			}
			// data.<...>, or a reference relative to the module's package
			// (x.y names data.<package>.x.y where x is one of its rules): a
			// reference past the alias reads its keys; one that stops
			// before it, or goes on with a dynamic key before reaching it,
			// may read it whole. A local variable read so only adds reads.
			var keys []string
			switch head, isVar := v[0].Value.(ast.Var); {
			case !isVar || v[0].Equal(ast.InputRootDocument):
				return false
			case v[0].Equal(ast.DefaultRootDocument):
				keys = constantKeys(v[1:])
			default:
				keys = append(relative(m, head), constantKeys(v[1:])...)
			}
			n := min(len(keys), len(full))
			if !slices.Equal(keys[:n], full[:n]) {
				return false
			}
			if len(keys) > len(full) {
				addAll(keys[len(full):])
				handled[t] = true
				return true
			}
			addAll(nil)
			return true
		case ast.Var:
			// The alias by name, or a rule of the module's package above
			// it (x for data.<package>.x.<name>) whole.
			if r := relative(m, v); isAlias(t) || len(r) < len(full) && slices.Equal(r, full[:len(r)]) {
				addAll(nil)
			}
		}
		return false
	}
	for _, imp := range m.Imports {
		ast.WalkTerms(imp, visit)
	}
	for _, r := range m.Rules {
		if r != a.def {
			walkTerms(r, visit)
		}
	}
}

// relative is the path below data a name of module m stands for, were it
// one of its package's rules: <package>.<name>.
func relative(m *ast.Module, name ast.Var) []string {
	return append(constantKeys(m.Package.Path[1:]), string(name))
}

// constantKeys is the longest prefix of string keys of a reference's
// elements, up to a key that is one of the read paths' markers.
func constantKeys(elems []*ast.Term) []string {
	var keys []string
	for _, k := range elems {
		s, isString := k.Value.(ast.String)
		if !isString || marker(string(s)) {
			break
		}
		keys = append(keys, string(s))
	}
	return keys
}

// marker reports whether a key the policies name is spelled as one of the
// markers a read path holds (elementKey, countKey, existsKey). Such a key
// ends a path's constant prefix, so the value it is read from is read
// whole: taken as a key, input.config["?"] would read only whether
// input.config is there.
func marker(key string) bool {
	return key == elementKey || key == countKey || key == existsKey
}

// inputPath is the path of t if it is a reference into the input of
// constant keys only.
func inputPath(t *ast.Term) ([]string, bool) {
	ref, isRef := t.Value.(ast.Ref)
	p, isInput := groundInputPrefix(t)
	return p, isRef && isInput && len(p) == len(ref)-1
}

// objectGetOfInput reads call as object.get(<input path>, <constant key or
// path>, default): the path of the object it reads from (base), and of the
// value it reads (path).
func objectGetOfInput(call ast.Call) (base, path []string, ok bool) {
	if len(call) != 4 || call[0].Value.String() != "object.get" {
		return nil, nil, false
	}
	base, isInput := inputPath(call[1])
	keys, constant := constantPath(call[2])
	if !isInput || !constant {
		return nil, nil, false
	}
	return base, append(slices.Clone(base), keys...), true
}

// groundInputPrefix returns, for a reference rooted at input, its longest
// prefix of constant string keys.
func groundInputPrefix(t *ast.Term) ([]string, bool) {
	ref, isRef := t.Value.(ast.Ref)
	if !isRef || len(ref) == 0 || !ref[0].Equal(ast.InputRootDocument) {
		return nil, false
	}
	return constantKeys(ref[1:]), true
}

// constantPath reads a constant object.get key: a string or an array of
// strings, none of them a marker (which the caller reads as a dynamic key).
func constantPath(t *ast.Term) ([]string, bool) {
	switch v := t.Value.(type) {
	case ast.String:
		return []string{string(v)}, !marker(string(v))
	case *ast.Array:
		var p []string
		for i := range v.Len() {
			s, isString := v.Elem(i).Value.(ast.String)
			if !isString || marker(string(s)) {
				return nil, false
			}
			p = append(p, string(s))
		}
		return p, true
	}
	return nil, false
}

// projection is the input paths the policies read, as a tree of keys,
// walked once over the input's JSON. A path ends in a node read whole (no
// path is below another, see coveringPaths); elementKey in a path goes on
// in every element of the list there, and countKey reads its number of
// elements.
type projection struct {
	root *projectionNode
}

type projectionNode struct {
	whole    bool            // a path ends here: the value whole
	exists   bool            // whether the value is there (existsKey)
	count    bool            // the number of elements (countKey)
	elem     *projectionNode // what of each element (elementKey)
	keys     []string        // the fields below, in the order the paths were found (a key is only compared within its Set)
	children []*projectionNode
	index    map[string]int // keys[i] -> i
}

func newProjection(paths [][]string) *projection {
	p := &projection{root: &projectionNode{}}
	for _, keys := range paths {
		n := p.root
		for i, k := range keys {
			last := i == len(keys)-1
			switch {
			case k == countKey && last:
				n.count = true
				continue
			case k == existsKey && last:
				n.exists = true
				continue
			case k == elementKey:
				if n.elem == nil {
					n.elem = &projectionNode{}
				}
				n = n.elem
			default:
				j, ok := n.index[k]
				if !ok {
					if n.index == nil {
						n.index = map[string]int{}
					}
					j = len(n.keys)
					n.index[k] = j
					n.keys = append(n.keys, k)
					n.children = append(n.children, &projectionNode{})
				}
				n = n.children[j]
			}
			if last {
				n.whole = true
			}
		}
	}
	return p
}

// field is the index of key among n's fields, or -1: a scan of the
// keys when they are few (most nodes read one to eight), cheaper
// than hashing the key for the map.
func (n *projectionNode) field(key string) int {
	if len(n.keys) > 8 {
		if i, ok := n.index[key]; ok {
			return i
		}
		return -1
	}
	for i, k := range n.keys {
		if k == key {
			return i
		}
	}
	return -1
}

// key hashes what the paths read of the input's JSON. encoding/json
// writes struct fields in a fixed order and map keys sorted, so equal
// values give equal bytes; a missing value hashes differently from any
// present one.
func (p *projection) key(inputJSON []byte) [32]byte {
	// Read in place: the Results point into inputJSON, which is neither
	// kept nor changed before key returns. What is hashed is gathered
	// first: sha256.Sum256 of one slice costs no allocation, where a
	// hash.Hash and its Writes of strings each do.
	r := gjson.Parse(unsafe.String(unsafe.SliceData(inputJSON), len(inputJSON)))
	return sha256.Sum256(p.root.appendTo(make([]byte, 0, 2048), r))
}

// appendTo appends to b what n reads of r: r whole, or its number of
// elements, each element as n.elem reads it, and each field as its node
// reads it (the last of duplicate keys, as OPA's decoding of the input
// keeps: encoding/json writes two map keys that differ only in invalid
// UTF-8 as the same key). A
// missing value reads as such (its fields as missing ones); a value not of
// the kind n expects (an object where a list was read, a string where
// fields were) is taken whole. Markers and
// terminators are bytes no JSON text holds (control characters are escaped
// in it, and 0xfb-0xff are not UTF-8), and every part ends in a
// terminator, so distinct projections never give the same bytes.
func (n *projectionNode) appendTo(b []byte, r gjson.Result) []byte {
	if n.whole {
		if !r.Exists() {
			return append(b, 0)
		}
		return append(append(b, 1), r.Raw...)
	}
	if n.exists {
		if r.Exists() {
			b = append(b, 9)
		} else {
			b = append(b, 0)
		}
		b = append(b, 0xfa)
	}
	// With each element read, their number is read with them.
	if n.count && n.elem == nil {
		switch {
		case !r.Exists():
			b = append(b, 0)
		case r.IsArray():
			count := 0
			r.ForEach(func(_, _ gjson.Result) bool {
				count++
				return true
			})
			b = strconv.AppendInt(append(b, 5), int64(count), 10)
		default:
			b = append(append(b, 2), r.Raw...)
		}
		b = append(b, 0xfc)
	}
	if n.elem != nil {
		switch {
		case !r.Exists():
			b = append(b, 0)
		case r.IsArray():
			b = append(b, 3)
			r.ForEach(func(_, v gjson.Result) bool {
				b = append(n.elem.appendTo(b, v), 0xfe)
				return true
			})
		default:
			b = append(append(b, 2), r.Raw...)
		}
		b = append(b, 0xfd)
	}
	if len(n.keys) == 0 {
		return b
	}
	var small [16]gjson.Result
	vals := small[:0]
	if len(n.keys) > len(small) {
		vals = make([]gjson.Result, len(n.keys))
	}
	vals = vals[:len(n.keys)]
	switch {
	case r.IsObject():
		r.ForEach(func(k, v gjson.Result) bool {
			if i := n.field(objectKey(k)); i >= 0 {
				vals[i] = v // the last of duplicate keys, as OPA decodes the input
			}
			return true
		})
	case r.Exists():
		// Not an object: taken whole (object.get of one is an error, where
		// that of an object without the field is its default).
		return append(append(b, 7), r.Raw...)
	}
	for i, c := range n.children {
		b = append(c.appendTo(b, vals[i]), 0xfb)
	}
	return b
}

// objectKey is an object's key as OPA reads it: decoded by encoding/json,
// which makes each invalid UTF-8 byte and each lone surrogate escape
// U+FFFD, where gjson keeps the bytes or reads two escapes as one. Keys
// in plain ASCII without escapes, nearly all, are the same either way.
func objectKey(k gjson.Result) string {
	for i := range len(k.Raw) {
		if c := k.Raw[i]; c == '\\' || c >= utf8.RuneSelf {
			var s string
			if json.Unmarshal([]byte(k.Raw), &s) == nil {
				return s
			}
			break
		}
	}
	return k.Str
}

// decisionCache is a bounded map from input projections to decisions.
type decisionCache struct {
	mu  sync.Mutex
	m   map[[32]byte]Decision
	max int
}

func newDecisionCache(max int) *decisionCache {
	return &decisionCache{m: make(map[[32]byte]Decision), max: max}
}

func (c *decisionCache) get(k [32]byte) (Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[k]
	return d, ok
}

func (c *decisionCache) put(k [32]byte, d Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		clear(c.m) // rare: the platform template changed often; start over
	}
	c.m[k] = d
}

package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// inputReads is the analysis behind the decision cache's key: the rule it
// keeps is in the package doc. It reads the modules one at a time, each in
// named steps (moduleReads); a read it cannot bound, or a call it cannot
// trust, turns the cache off with a reason (turnOff, cacheoff.go).

// inputReads returns the input paths the modules read, each as a list of
// keys, and why the cache is off if it is (nil when it is on): a read
// covers the whole input, a built-in is not in pureBuiltins, a with or a
// name changes what a call means (CacheOffForms).
func inputReads(modules map[string]*ast.Module) (paths [][]string, off *CacheOff) {
	a := newAnalysis(modules)
	if a.shadowsBuiltins() {
		return nil, a.off
	}
	a.aliases = a.inputAliases()
	a.aliasBaseReads()
	for _, file := range a.files {
		a.moduleReads(file)
	}
	return coveringPaths(a.paths), a.off
}

// analysis is one reading of a set's modules, tests left out: the input
// paths they read, and why the cache is off if it is.
type analysis struct {
	modules map[string]*ast.Module
	files   []string // the modules' names, tests left out, sorted
	aliases []inputAlias
	paths   [][]string
	seen    map[string]bool // pathKey of each of paths
	off     *CacheOff       // the first place that turns the cache off, nil while none does
	offAt   map[string]bool // each place that does, once (turnOff)
}

func newAnalysis(modules map[string]*ast.Module) *analysis {
	a := &analysis{modules: modules, seen: map[string]bool{}, offAt: map[string]bool{}}
	for _, name := range sortedKeys(modules) {
		if !strings.HasSuffix(name, "_test.rego") {
			a.files = append(a.files, name)
		}
	}
	return a
}

// read adds path p, read by term from, to the reads. An empty one is the
// whole input, which bounds nothing: the cache is off.
func (a *analysis) read(p []string, from *ast.Term) {
	if len(p) == 0 {
		a.wholeInput(from)
		return
	}
	if k := pathKey(p); !a.seen[k] {
		a.seen[k] = true
		a.paths = append(a.paths, p)
	}
}

// aliasBaseReads adds whether the object each alias's object.get reads
// from is there: an alias is undefined where that object is missing, and
// its default where the object lacks the key.
func (a *analysis) aliasBaseReads() {
	for _, al := range a.aliases {
		for _, b := range al.bases {
			a.read(existsRead(b), al.def.Head.Value)
		}
	}
}

// moduleReads adds the reads of one module, and turns the cache off for
// what in it cannot be cached. A term read through an alias, a list's
// elements or object.get is marked in handled, so that the last step does
// not read it whole.
func (a *analysis) moduleReads(file string) {
	m := a.modules[file]
	handled := map[*ast.Term]bool{}
	// An alias's own definition reads nothing by itself: its uses do.
	for _, al := range a.aliases {
		if al.module == file {
			al.markDefinition(handled)
		}
	}
	// Lists iterated element by element, the elements' fields read by
	// name (elements.go): each field read through its elements.
	for _, r := range m.Rules {
		a.elementReads(m, r, handled)
	}
	for _, al := range a.aliases {
		a.aliasReads(m, al, handled)
	}
	a.builtinCalls(m)
	a.withs(m)
	a.objectGetReads(m, handled)
	a.referenceReads(m, handled)
}

// builtinCalls turns the cache off for a call of a built-in not in
// pureBuiltins. A built-in is called in two forms: as a term (x :=
// time.now_ns()) and as a statement whose last argument is the output
// (time.now_ns(x), http.send(req, resp)); the second is an expression
// whose first term is the operator, not an ast.Call.
func (a *analysis) builtinCalls(m *ast.Module) {
	walkExprs(m, func(e *ast.Expr) bool {
		if !e.IsCall() {
			return false
		}
		if what, isImpure := impure(e.Operator().String()); isImpure {
			a.turnOff(CacheOffImpureBuiltin, e.Location, "a call of "+what)
		}
		return false
	})
	walkTerms(m, func(t *ast.Term) bool {
		call, isCall := t.Value.(ast.Call)
		if !isCall || len(call) == 0 {
			return false
		}
		if what, isImpure := impure(call[0].Value.String()); isImpure {
			a.turnOff(CacheOffImpureBuiltin, t.Location, "a call of "+what)
		}
		return false
	})
}

// withs turns the cache off for a `with` that replaces a built-in or a
// function named without its data. path (with object.get as f): it changes
// what the reads found in the syntax mean. And for one that mocks a
// function with a built-in that is not pure (with data.p.f as
// uuid.rfc4122): it calls the built-in where no call of it shows.
func (a *analysis) withs(m *ast.Module) {
	walkExprs(m, func(e *ast.Expr) bool {
		for _, w := range e.With {
			if ref, isRef := w.Target.Value.(ast.Ref); !isRef || !ref[0].Equal(ast.InputRootDocument) && !ref[0].Equal(ast.DefaultRootDocument) {
				a.turnOff(CacheOffWithTarget, w.Target.Location,
					fmt.Sprintf("%s replaces %s, a built-in or a function named without its data. path", regoText(w), w.Target))
			}
			switch w.Value.Value.(type) {
			case ast.Ref, ast.Var:
				if what, isImpure := impure(w.Value.Value.String()); isImpure {
					a.turnOff(CacheOffWithImpureBuiltin, w.Value.Location, fmt.Sprintf("%s mocks a function with %s", regoText(w), what))
				}
			}
		}
		return false
	})
}

// objectGetReads adds, for object.get(<input ref>, <constant key or path>,
// default), the input ref extended by the key and whether the ref is
// there; the bare ref is not read otherwise.
func (a *analysis) objectGetReads(m *ast.Module, handled map[*ast.Term]bool) {
	walkTerms(m, func(t *ast.Term) bool {
		call, isCall := t.Value.(ast.Call)
		if !isCall {
			return false
		}
		if base, path, isGet := objectGetOfInput(call); isGet && !handled[call[1]] {
			a.read(path, t)
			if e := existsRead(base); e != nil {
				a.read(e, t)
			}
			handled[call[1]] = true
		}
		return false
	})
}

// referenceReads adds every other reference into the input, by its
// constant keys: input.pod.spec[f] reads pod.spec whole, input[k] the
// whole input.
func (a *analysis) referenceReads(m *ast.Module, handled map[*ast.Term]bool) {
	walkTerms(m, func(t *ast.Term) bool {
		if handled[t] {
			return false
		}
		if p, isInput := groundInputPrefix(t); isInput {
			a.read(p, t)
		}
		return false
	})
}

// shadowsBuiltins turns the cache off, and reports, where a module
// defines, or imports, a name that a built-in's name starts with (object,
// array, time, ...): a call such as object.get(...) then calls the
// policies' own function, and what the analysis reads from the syntax of
// a built-in's call does not hold.
func (a *analysis) shadowsBuiltins() bool {
	roots := map[string]bool{}
	for name := range ast.BuiltinMap {
		if root, _, dotted := strings.Cut(name, "."); dotted {
			roots[root] = true
		}
	}
	for _, file := range a.files {
		m := a.modules[file]
		for _, r := range m.Rules {
			if ref := r.Head.Ref(); len(ref) > 0 && roots[strings.Trim(ref[0].String(), `"`)] {
				a.turnOff(CacheOffBuiltinName, r.Location, fmt.Sprintf("rule %s takes the name of the built-ins %s.*", ref, strings.Trim(ref[0].String(), `"`)))
			}
		}
		for _, imp := range m.Imports {
			if name := string(imp.Name()); roots[name] {
				a.turnOff(CacheOffBuiltinName, imp.Location, fmt.Sprintf("%s names the built-ins %s.*", imp, name))
			}
		}
	}
	return a.off != nil
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

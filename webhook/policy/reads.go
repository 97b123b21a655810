package policy

import (
	"slices"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
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

package policy

import (
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

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

// aliasNamed returns the alias t names in module m: its name in its own
// package, or data.<package>.<name>.
func aliasNamed(m *ast.Module, t *ast.Term, aliases []inputAlias) (inputAlias, bool) {
	for _, a := range aliases {
		switch x := t.Value.(type) {
		case ast.Var:
			if m.Package.Path.Equal(a.pkg) && x.Equal(a.name) {
				return a, true
			}
		case ast.Ref:
			if x.Equal(a.full) {
				return a, true
			}
		}
	}
	return inputAlias{}, false
}

// listAliases finds the list aliases of the modules (tests left out):
// `name := array.concat(a, b)`, defined once, each of a and b an input
// path (a reference or object.get of constant keys, with a constant
// default) or an alias of the same package. found are the aliases known so
// far; one list alias may name another.
func listAliases(modules map[string]*ast.Module, defs map[string]int, found []inputAlias) []inputAlias {
	var out []inputAlias
	known := map[string]bool{}
	for _, a := range found {
		known[a.full.String()] = true
	}
	for changed := true; changed; {
		changed = false
		for file, m := range modules {
			if strings.HasSuffix(file, "_test.rego") {
				continue
			}
			for _, r := range m.Rules {
				ref := r.Head.Ref()
				if len(ref) != 1 || r.Default || r.Else != nil || len(r.Head.Args) > 0 || r.Head.Key != nil || r.Head.Value == nil {
					continue
				}
				name, isVar := ref[0].Value.(ast.Var)
				if !isVar {
					continue
				}
				full := m.Package.Path.Append(ast.StringTerm(string(name)))
				if known[full.String()] || defs[full.String()] != 1 {
					continue
				}
				if len(r.Body) != 1 || !r.Body[0].Equal(ast.NewExpr(ast.BooleanTerm(true))) {
					continue
				}
				call, isCall := r.Head.Value.Value.(ast.Call)
				if !isCall || len(call) != 3 || call[0].Value.String() != "array.concat" {
					continue
				}
				var paths, bases [][]string
				ok := true
				for _, arg := range call[1:] {
					p, b, isList := aliasListPaths(m, arg, append(slices.Clone(found), out...))
					if !isList {
						ok = false
						break
					}
					for _, q := range p {
						paths = appendPath(paths, q)
					}
					for _, q := range b {
						bases = appendPath(bases, q)
					}
				}
				if !ok {
					continue
				}
				out = append(out, inputAlias{module: file, def: r, pkg: m.Package.Path, name: name, full: full, paths: paths, bases: bases, list: true})
				known[full.String()], changed = true, true
			}
		}
	}
	return out
}

// aliasListPaths reads one argument of a list alias's array.concat: an
// input reference of constant keys, object.get of one with a constant key
// and default, or an alias of the module's package. bases are the objects
// object.get reads from (inputAlias.bases).
func aliasListPaths(m *ast.Module, t *ast.Term, aliases []inputAlias) (paths, bases [][]string, ok bool) {
	switch x := t.Value.(type) {
	case ast.Ref:
		if p, isInput := inputPath(t); isInput && len(p) > 0 {
			return [][]string{p}, nil, true
		}
	case ast.Var:
		if a, isAlias := aliasNamed(m, t, aliases); isAlias {
			return a.paths, a.bases, true
		}
	case ast.Call:
		base, path, isGet := objectGetOfInput(x)
		if !isGet || len(path) == len(base) || !ast.IsConstant(x[3].Value) {
			return nil, nil, false
		}
		if len(base) > 0 {
			bases = [][]string{base}
		}
		return [][]string{path}, bases, true
	}
	return nil, nil, false
}

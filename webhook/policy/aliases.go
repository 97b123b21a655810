package policy

import (
	"slices"

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

// inputAliases finds the input aliases of the modules, list aliases
// included.
func (a *analysis) inputAliases() []inputAlias {
	defs := a.ruleDefinitions()
	var out []inputAlias
	for _, file := range a.files {
		m := a.modules[file]
		for _, r := range m.Rules {
			if al, ok := objectGetAlias(file, m, r); ok {
				out = append(out, al)
			}
		}
	}
	// A name defined by more than one rule (an else, a default, another
	// file) is not an alias.
	out = slices.DeleteFunc(out, func(al inputAlias) bool { return defs[al.full.String()] != 1 })
	return append(out, a.listAliases(defs, out)...)
}

// ruleDefinitions counts the rules of each data.<package>.<name>, of any
// kind.
func (a *analysis) ruleDefinitions() map[string]int {
	defs := map[string]int{}
	for _, file := range a.files {
		m := a.modules[file]
		for _, r := range m.Rules {
			if ref := r.Head.Ref(); len(ref) > 0 {
				if name, isVar := ref[0].Value.(ast.Var); isVar {
					defs[m.Package.Path.Append(ast.StringTerm(string(name))).String()]++
				}
			}
		}
	}
	return defs
}

// namingRule reads r as `name := <call>` and nothing else (no else,
// default, arguments, key or body): its name, data.<package>.<name> and
// the call.
func namingRule(m *ast.Module, r *ast.Rule) (name ast.Var, full ast.Ref, call ast.Call, ok bool) {
	ref := r.Head.Ref()
	if len(ref) != 1 || r.Default || r.Else != nil || len(r.Head.Args) > 0 || r.Head.Key != nil || r.Head.Value == nil {
		return "", nil, nil, false
	}
	name, isVar := ref[0].Value.(ast.Var)
	if !isVar {
		return "", nil, nil, false
	}
	if len(r.Body) != 1 || !r.Body[0].Equal(ast.NewExpr(ast.BooleanTerm(true))) {
		return "", nil, nil, false
	}
	call, isCall := r.Head.Value.Value.(ast.Call)
	if !isCall {
		return "", nil, nil, false
	}
	return name, m.Package.Path.Append(ast.StringTerm(string(name))), call, true
}

// objectGetAlias reads r, of module m in file, as an input alias:
// `name := object.get(<input path>, <constant key or path>, <constant
// default>)`. Whether it is defined once is the caller's to check.
func objectGetAlias(file string, m *ast.Module, r *ast.Rule) (inputAlias, bool) {
	name, full, call, ok := namingRule(m, r)
	if !ok || len(call) != 4 || !ast.IsConstant(call[3].Value) {
		return inputAlias{}, false
	}
	base, path, isGet := objectGetOfInput(call)
	if !isGet {
		return inputAlias{}, false
	}
	al := inputAlias{
		module: file, def: r, pkg: m.Package.Path, name: name, full: full, paths: [][]string{path},
		byKey: call[3].Value.Compare(ast.NewObject()) == 0,
	}
	if len(base) > 0 {
		al.bases = [][]string{base}
	}
	return al, true
}

// listAliases finds the list aliases of the modules: `name :=
// array.concat(a, b)`, defined once, each of a and b an input path (a
// reference or object.get of constant keys, with a constant default) or
// an alias of the same package. found are the aliases known so far; one
// list alias may name another, so the search goes on until it finds no
// new one.
func (a *analysis) listAliases(defs map[string]int, found []inputAlias) []inputAlias {
	var out []inputAlias
	known := map[string]bool{}
	for _, al := range found {
		known[al.full.String()] = true
	}
	for changed := true; changed; {
		changed = false
		for _, file := range a.files {
			m := a.modules[file]
			for _, r := range m.Rules {
				name, full, call, ok := namingRule(m, r)
				if !ok || known[full.String()] || defs[full.String()] != 1 || len(call) != 3 || call[0].Value.String() != "array.concat" {
					continue
				}
				paths, bases, isList := concatPaths(m, call[1:], append(slices.Clone(found), out...))
				if !isList {
					continue
				}
				out = append(out, inputAlias{module: file, def: r, pkg: m.Package.Path, name: name, full: full, paths: paths, bases: bases, list: true})
				known[full.String()], changed = true, true
			}
		}
	}
	return out
}

// concatPaths reads the arguments of a list alias's array.concat (see
// aliasListPaths): the paths and bases of them all.
func concatPaths(m *ast.Module, args []*ast.Term, aliases []inputAlias) (paths, bases [][]string, ok bool) {
	for _, arg := range args {
		p, b, isList := aliasListPaths(m, arg, aliases)
		if !isList {
			return nil, nil, false
		}
		for _, q := range p {
			paths = appendPath(paths, q)
		}
		for _, q := range b {
			bases = appendPath(bases, q)
		}
	}
	return paths, bases, true
}

// aliasReads adds the input paths module m reads through alias al: the
// alias's path extended by the constant keys of al["key"] or
// object.get(al, <constant key or path>, default); any other use (the
// alias whole, a dynamic key, a reference to its package that may reach
// it) reads the whole path. done are the module's terms its other reads
// took.
func (a *analysis) aliasReads(m *ast.Module, al inputAlias, done map[*ast.Term]bool) {
	u := &aliasUses{
		a: a, m: m, alias: al, samePackage: m.Package.Path.Equal(al.pkg),
		full: constantKeys(al.full[1:]), handled: map[*ast.Term]bool{}, done: done,
	}
	for _, imp := range m.Imports {
		ast.WalkTerms(imp, u.visit)
	}
	for _, r := range m.Rules {
		if r != al.def {
			walkTerms(r, u.visit)
		}
	}
}

// aliasUses reads the uses of one alias in one module.
type aliasUses struct {
	a           *analysis
	m           *ast.Module
	alias       inputAlias
	samePackage bool               // the module is of the alias's package
	full        []string           // the alias's path below data
	handled     map[*ast.Term]bool // terms read here already
	done        map[*ast.Term]bool // terms the module's other reads took
}

// visit reads one term's use of the alias, if it is one.
func (u *aliasUses) visit(t *ast.Term) bool {
	if u.handled[t] || u.done[t] {
		return false
	}
	switch v := t.Value.(type) {
	case ast.Call:
		u.viaGet(v)
	case ast.Ref:
		return u.viaRef(t, v)
	case ast.Var:
		u.viaName(t, v)
	}
	return false
}

// names reports whether t names the alias: its name in its own package,
// data.<package>.<name> anywhere.
func (u *aliasUses) names(t *ast.Term) bool {
	if v, isVar := t.Value.(ast.Var); isVar {
		return u.samePackage && v.Equal(u.alias.name)
	}
	ref, isRef := t.Value.(ast.Ref)
	return isRef && ref.Equal(u.alias.full)
}

// read adds the alias's paths extended by keys, read by term from: by
// keys only where the alias reads by key (inputAlias.byKey), whole
// otherwise.
func (u *aliasUses) read(keys []string, from *ast.Term) {
	if !u.alias.byKey {
		keys = nil
	}
	for _, p := range u.alias.paths {
		u.a.read(append(slices.Clone(p), keys...), from)
	}
}

// viaGet reads object.get(<alias>, <constant key or path>, default).
func (u *aliasUses) viaGet(call ast.Call) {
	if len(call) != 4 || call[0].Value.String() != "object.get" || !u.names(call[1]) {
		return
	}
	if key, constant := constantPath(call[2]); constant {
		u.read(key, call[1])
		u.handled[call[1]] = true
	}
}

// viaRef reads a reference: <alias>["key"]... in the alias's package, or
// one into data that reaches the alias (see dataPath). A reference past
// the alias reads its keys; one that stops before it, or goes on with a
// dynamic key before reaching it, may read it whole. It reports whether
// the walk has read all it needs below t.
func (u *aliasUses) viaRef(t *ast.Term, ref ast.Ref) bool {
	if u.samePackage && u.names(ref[0]) {
		if keys := constantKeys(ref[1:]); len(keys) > 0 {
			u.read(keys, t)
			u.handled[ref[0]] = true
		}
		return false
	}
	keys, intoData := u.dataPath(ref)
	if !intoData {
		return false
	}
	n := min(len(keys), len(u.full))
	if !slices.Equal(keys[:n], u.full[:n]) {
		return false
	}
	if len(keys) > len(u.full) {
		u.read(keys[len(u.full):], t)
		u.handled[t] = true
		return true
	}
	u.read(nil, t)
	return true
}

// dataPath is the path below data of a reference's constant keys, for
// data.<...> or a reference relative to the module's package (x.y names
// data.<package>.x.y where x is one of its rules: a local variable read
// so only adds reads); false for input or a reference from a value.
func (u *aliasUses) dataPath(ref ast.Ref) ([]string, bool) {
	head, isVar := ref[0].Value.(ast.Var)
	switch {
	case !isVar || ref[0].Equal(ast.InputRootDocument):
		return nil, false
	case ref[0].Equal(ast.DefaultRootDocument):
		return constantKeys(ref[1:]), true
	default:
		return append(relative(u.m, head), constantKeys(ref[1:])...), true
	}
}

// viaName reads the alias by name, or a rule of the module's package
// above it (x for data.<package>.x.<name>), whole.
func (u *aliasUses) viaName(t *ast.Term, v ast.Var) {
	if r := relative(u.m, v); u.names(t) || len(r) < len(u.full) && slices.Equal(r, u.full[:len(r)]) {
		u.read(nil, t)
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

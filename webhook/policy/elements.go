package policy

import (
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Runner pods of one template differ per task in their containers: a
// task's variables, command, arguments, image. Policies iterate the
// containers (`some c in input.pod.spec.containers`) and read some fields of
// each by name (c.name, c.image, object.get(c, "env", [])); read as a
// whole, the list would put every task's variables in the cache key, and no
// two tasks' pods would share a decision.
//
// elementReads follows, in one rule, each variable that `some v in <list>`
// binds to the elements of an input list, and reads through it:
//   - v.<key>... or object.get(v, <constant key or path>, default) reads
//     that field of every element: the path <list>.*.<key>...;
//   - such a field iterated in turn (`some e in object.get(v, "env", [])`)
//     binds e the same way, one level down (<list>.*.env.*.<key>);
//   - any other use of v (v whole, a dynamic key, an argument of a
//     function) reads whole elements: <list>.*, which is the list whole;
//   - the iteration itself reads the number of elements (<list>.#), which
//     a rule that uses no element still depends on.
// A list is an input reference or object.get of constant keys, a variable
// bound so, or an alias of one (inputAlias, list aliases included). The
// projection (cache.go) hashes, for a path with "*", the list's length and
// each element's value at the rest of the path, in order: what the rule can
// see of the list.

// elementKey stands in a read path for every element of a list, and
// countKey for the number of its elements: iterating a list reads that
// much even when the elements are not used.
const (
	elementKey = "*"
	countKey   = "#"
	// existsKey reads whether a value is there at all: object.get(x, k, d)
	// is d where x is an object without k, and undefined where x is
	// missing, which the reads of x's fields alone do not tell apart.
	existsKey = "?"
)

// existsRead is the read of whether the value at path is there, for an
// object.get whose object is that path; nil for the input itself, which is
// always there.
func existsRead(path []string) []string {
	if len(path) == 0 {
		return nil
	}
	return append(slices.Clone(path), existsKey)
}

// member is the builtin `x in xs` and `some x in xs` are calls of; with a
// key (`some k, x in xs`), memberWithKey.
var (
	member        = ast.Member.Ref().String()
	memberWithKey = ast.MemberWithKey.Ref().String()
)

// elementReads adds the reads of rule r through the element variables it
// binds, and marks in handled the lists it binds them from (their reads are
// their elements' fields, not the lists whole).
func (a *analysis) elementReads(m *ast.Module, r *ast.Rule, handled map[*ast.Term]bool) {
	e := &ruleElements{
		a: a, m: m, r: r, handled: handled,
		elems: map[ast.Var][][]string{}, binding: map[*ast.Term]bool{}, collections: map[*ast.Term]bool{}, byField: map[*ast.Term]bool{},
	}
	e.bind()
	if len(e.elems) == 0 {
		return
	}
	e.fieldReads()
	e.wholeReads()
}

// ruleElements reads one rule through the element variables it binds.
type ruleElements struct {
	a           *analysis
	m           *ast.Module
	r           *ast.Rule
	handled     map[*ast.Term]bool     // the module's terms read otherwise than whole
	elems       map[ast.Var][][]string // element variable: its element paths, ending in "*"
	binding     map[*ast.Term]bool     // a variable's occurrence that binds it
	collections map[*ast.Term]bool     // the lists variables are bound from
	byField     map[*ast.Term]bool     // an element variable's occurrence read by field
}

// bind binds the rule's element variables until nothing new: a variable
// bound from another's field needs that one bound first.
func (e *ruleElements) bind() {
	for changed := true; changed; {
		changed = false
		walkExprs(e.r, func(x *ast.Expr) bool {
			decl, isSome := x.Terms.(*ast.SomeDecl)
			if !isSome {
				return false
			}
			for _, sym := range decl.Symbols {
				if e.bindSome(sym) {
					changed = true
				}
			}
			return false
		})
	}
}

// bindSome binds the variable of `some v in <list>` (or `some k, v in
// <list>`) to the list's elements, if the list is one and v not bound
// there yet; the iteration reads the list's number of elements.
func (e *ruleElements) bindSome(sym *ast.Term) bool {
	elem, list, isMember := memberOf(sym)
	if !isMember {
		return false
	}
	v, isVar := elem.Value.(ast.Var)
	if !isVar || e.binding[elem] {
		return false
	}
	paths, isList := e.listPaths(list)
	if !isList {
		return false
	}
	for _, p := range paths {
		e.elems[v] = appendPath(e.elems[v], append(slices.Clone(p), elementKey))
		e.a.read(append(slices.Clone(p), countKey), list)
	}
	e.binding[elem], e.collections[list] = true, true
	return true
}

// memberOf reads a symbol of a some declaration as `elem in list` or
// `key, elem in list`.
func memberOf(sym *ast.Term) (elem, list *ast.Term, ok bool) {
	call, isCall := sym.Value.(ast.Call)
	if !isCall {
		return nil, nil, false
	}
	switch op := call[0].Value.String(); {
	case op == member && len(call) == 3:
		return call[1], call[2], true
	case op == memberWithKey && len(call) == 4:
		return call[2], call[3], true
	}
	return nil, nil, false
}

// fieldReads adds the fields the rule reads of its elements by name:
// v.<key>..., and object.get(v, <constant key or path>, default) as a term
// or as a statement (its terms the expression's, not a call term:
// object.get(v, <constant key or path>, default[, out])).
func (e *ruleElements) fieldReads() {
	walkTerms(e.r, func(t *ast.Term) bool {
		switch x := t.Value.(type) {
		case ast.Ref:
			e.refFieldRead(t, x)
		case ast.Call:
			if len(x) == 4 && x[0].Value.String() == "object.get" {
				e.getFieldRead(x[1:], e.collections[t])
			}
		}
		return false
	})
	walkExprs(e.r, func(x *ast.Expr) bool {
		if terms, isCall := x.Terms.([]*ast.Term); isCall && len(terms) >= 4 && terms[0].Value.String() == "object.get" {
			e.getFieldRead(terms[1:], false)
		}
		return false
	})
}

// refFieldRead reads v.<key>... of an element variable v, unless the
// reference is a list bound in turn (its elements' fields are read).
func (e *ruleElements) refFieldRead(t *ast.Term, ref ast.Ref) {
	v, isVar := ref[0].Value.(ast.Var)
	if !isVar || e.elems[v] == nil {
		return
	}
	if keys := constantKeys(ref[1:]); len(keys) > 0 {
		e.byField[ref[0]] = true
		if !e.collections[t] {
			e.each(v, keys, t)
		}
	}
}

// getFieldRead reads object.get(v, <constant key or path>, default), its
// arguments given, unless the call is a list bound in turn.
func (e *ruleElements) getFieldRead(args []*ast.Term, collection bool) {
	v, isVar := args[0].Value.(ast.Var)
	if !isVar || e.elems[v] == nil {
		return
	}
	if keys, constant := constantPath(args[1]); constant {
		e.byField[args[0]] = true
		if !collection {
			e.each(v, keys, args[0])
		}
	}
}

// wholeReads reads the elements whole where the rule uses an element
// variable otherwise than by field or to bind it.
func (e *ruleElements) wholeReads() {
	walkTerms(e.r, func(t *ast.Term) bool {
		if v, isVar := t.Value.(ast.Var); isVar && e.elems[v] != nil && !e.binding[t] && !e.byField[t] {
			e.each(v, nil, t)
		}
		return false
	})
}

// each reads keys of every element v is bound to, by term from.
func (e *ruleElements) each(v ast.Var, keys []string, from *ast.Term) {
	for _, p := range under(e.elems[v], keys) {
		e.a.read(p, from)
	}
}

// listPaths returns the input paths of the list t names, if it names one:
// an input reference or object.get of constant keys, an element variable's
// field, or an alias. It marks in handled what it read t through.
func (e *ruleElements) listPaths(t *ast.Term) ([][]string, bool) {
	switch x := t.Value.(type) {
	case ast.Ref:
		return e.refListPaths(t, x)
	case ast.Var:
		return e.aliasListPaths(t)
	case ast.Call:
		return e.getListPaths(x)
	}
	return nil, false
}

// refListPaths reads a reference as a list: an element variable's field
// of constant keys, an input path, or an alias.
func (e *ruleElements) refListPaths(t *ast.Term, ref ast.Ref) ([][]string, bool) {
	if v, isVar := ref[0].Value.(ast.Var); isVar && e.elems[v] != nil {
		keys := constantKeys(ref[1:])
		if len(keys) == 0 || len(keys) != len(ref)-1 {
			return nil, false
		}
		return under(e.elems[v], keys), true
	}
	if p, isInput := inputPath(t); isInput && len(p) > 0 {
		e.handled[t] = true
		return [][]string{p}, true
	}
	return e.aliasListPaths(t)
}

// aliasListPaths reads t as an alias's name.
func (e *ruleElements) aliasListPaths(t *ast.Term) ([][]string, bool) {
	if al, isAlias := aliasNamed(e.m, t, e.a.aliases); isAlias {
		e.handled[t] = true
		return al.paths, true
	}
	return nil, false
}

// getListPaths reads object.get(<x>, <constant key or path>, default) as a
// list: x an element variable or an input path (whose presence the call
// reads too).
func (e *ruleElements) getListPaths(call ast.Call) ([][]string, bool) {
	if len(call) != 4 || call[0].Value.String() != "object.get" {
		return nil, false
	}
	keys, constant := constantPath(call[2])
	if !constant || len(keys) == 0 {
		return nil, false
	}
	if v, isVar := call[1].Value.(ast.Var); isVar && e.elems[v] != nil {
		return under(e.elems[v], keys), true
	}
	if base, path, isGet := objectGetOfInput(call); isGet {
		e.handled[call[1]] = true
		if ex := existsRead(base); ex != nil {
			e.a.read(ex, call[1])
		}
		return [][]string{path}, true
	}
	return nil, false
}

// under is each of paths extended by keys.
func under(paths [][]string, keys []string) [][]string {
	out := make([][]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, append(slices.Clone(p), keys...))
	}
	return out
}

// appendPath appends p to paths unless it is there already.
func appendPath(paths [][]string, p []string) [][]string {
	if slices.ContainsFunc(paths, func(q []string) bool { return slices.Equal(p, q) }) {
		return paths
	}
	return append(paths, p)
}

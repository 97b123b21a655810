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
func elementReads(m *ast.Module, r *ast.Rule, aliases []inputAlias, handled map[*ast.Term]bool, add func([]string)) {
	elems := map[ast.Var][][]string{} // element variable: its element paths, ending in "*"
	binding := map[*ast.Term]bool{}   // a variable's occurrence that binds it
	collections := map[*ast.Term]bool{}
	// Bind until nothing new: a variable bound from another's field needs
	// that one bound first.
	for changed := true; changed; {
		changed = false
		walkExprs(r, func(e *ast.Expr) bool {
			decl, isSome := e.Terms.(*ast.SomeDecl)
			if !isSome {
				return false
			}
			for _, sym := range decl.Symbols {
				call, isCall := sym.Value.(ast.Call)
				if !isCall {
					continue
				}
				var elem, list *ast.Term
				switch op := call[0].Value.String(); {
				case op == member && len(call) == 3:
					elem, list = call[1], call[2]
				case op == memberWithKey && len(call) == 4:
					elem, list = call[2], call[3]
				default:
					continue
				}
				v, isVar := elem.Value.(ast.Var)
				if !isVar || binding[elem] {
					continue
				}
				paths, ok := listPaths(m, list, aliases, elems, handled, add)
				if !ok {
					continue
				}
				for _, p := range paths {
					elems[v] = appendPath(elems[v], append(slices.Clone(p), elementKey))
					add(append(slices.Clone(p), countKey))
				}
				binding[elem], collections[list] = true, true
				changed = true
			}
			return false
		})
	}
	if len(elems) == 0 {
		return
	}
	addEach := func(v ast.Var, keys []string) {
		for _, p := range under(elems[v], keys) {
			add(p)
		}
	}
	read := map[*ast.Term]bool{} // an element variable's occurrence read by field
	// viaGet reads object.get(v, <constant key or path>, default), its
	// arguments given, unless the call is a list bound in turn.
	viaGet := func(args []*ast.Term, collection bool) {
		v, isVar := args[0].Value.(ast.Var)
		if !isVar || elems[v] == nil {
			return
		}
		if keys, constant := constantPath(args[1]); constant {
			read[args[0]] = true
			if !collection {
				addEach(v, keys)
			}
		}
	}
	walkTerms(r, func(t *ast.Term) bool {
		switch x := t.Value.(type) {
		case ast.Ref:
			v, isVar := x[0].Value.(ast.Var)
			if !isVar || elems[v] == nil {
				return false
			}
			if keys := constantKeys(x[1:]); len(keys) > 0 {
				read[x[0]] = true
				if !collections[t] {
					addEach(v, keys)
				}
			}
		case ast.Call:
			if len(x) == 4 && x[0].Value.String() == "object.get" {
				viaGet(x[1:], collections[t])
			}
		}
		return false
	})
	// object.get as a statement (its terms the expression's, not a call
	// term): object.get(v, <constant key or path>, default[, out]).
	walkExprs(r, func(e *ast.Expr) bool {
		if terms, isCall := e.Terms.([]*ast.Term); isCall && len(terms) >= 4 && terms[0].Value.String() == "object.get" {
			viaGet(terms[1:], false)
		}
		return false
	})
	walkTerms(r, func(t *ast.Term) bool {
		if v, isVar := t.Value.(ast.Var); isVar && elems[v] != nil && !binding[t] && !read[t] {
			addEach(v, nil) // used whole
		}
		return false
	})
}

// listPaths returns the input paths of the list t names, if it names one:
// an input reference or object.get of constant keys, an element variable's
// field, or an alias. It marks in handled what it read t through.
func listPaths(m *ast.Module, t *ast.Term, aliases []inputAlias, elems map[ast.Var][][]string, handled map[*ast.Term]bool, add func([]string)) ([][]string, bool) {
	switch x := t.Value.(type) {
	case ast.Ref:
		if v, isVar := x[0].Value.(ast.Var); isVar && elems[v] != nil {
			keys := constantKeys(x[1:])
			if len(keys) == 0 || len(keys) != len(x)-1 {
				return nil, false
			}
			return under(elems[v], keys), true
		}
		if p, isInput := inputPath(t); isInput && len(p) > 0 {
			handled[t] = true
			return [][]string{p}, true
		}
		if a, isAlias := aliasNamed(m, t, aliases); isAlias {
			handled[t] = true
			return a.paths, true
		}
	case ast.Var:
		if a, isAlias := aliasNamed(m, t, aliases); isAlias {
			handled[t] = true
			return a.paths, true
		}
	case ast.Call:
		if len(x) != 4 || x[0].Value.String() != "object.get" {
			return nil, false
		}
		keys, constant := constantPath(x[2])
		if !constant || len(keys) == 0 {
			return nil, false
		}
		if v, isVar := x[1].Value.(ast.Var); isVar && elems[v] != nil {
			return under(elems[v], keys), true
		}
		if base, path, isGet := objectGetOfInput(x); isGet {
			handled[x[1]] = true
			if e := existsRead(base); e != nil {
				add(e)
			}
			return [][]string{path}, true
		}
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

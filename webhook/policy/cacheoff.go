package policy

import (
	"cmp"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
)

// CacheOffForm is the Rego construct that turns a set's decision cache
// off. The forms are a small fixed set (CacheOffForms): a metric's label
// takes them.
type CacheOffForm string

// The forms that turn the decision cache off. Any other form keeps a set
// cacheable: what it reads, the analysis bounds.
const (
	// CacheOffWholeInput: a read of the whole input, which no key bounds:
	// input itself (json.marshal(input)), input[k] or object.get(input,
	// k, d) with a key k that is not a constant (or one spelled "?", "#"
	// or "*"), an alias of the whole input.
	CacheOffWholeInput CacheOffForm = "whole-input"
	// CacheOffImpureBuiltin: a call of a built-in not known to be pure
	// (builtins.go), as a term (time.now_ns()) or as a statement
	// (time.now_ns(t)).
	CacheOffImpureBuiltin CacheOffForm = "impure-builtin"
	// CacheOffWithImpureBuiltin: a with that mocks a function with such a
	// built-in (f(x) with data.lib.f as uuid.rfc4122), which calls it
	// where no call of it shows.
	CacheOffWithImpureBuiltin CacheOffForm = "with-impure-builtin"
	// CacheOffWithTarget: a with that replaces a built-in, or a function
	// named without its data. path (with object.get as f): the reads the
	// syntax shows no longer mean what they say.
	CacheOffWithTarget CacheOffForm = "with-target"
	// CacheOffBuiltinName: a rule or an import that takes a name a
	// built-in's starts with (object.get(x, _, _) := x, import
	// data.lib.array): a call such as object.get(...) calls the policies'
	// own function.
	CacheOffBuiltinName CacheOffForm = "builtin-name"
)

// CacheOffForms are all the forms that turn the decision cache off.
func CacheOffForms() []CacheOffForm {
	return []CacheOffForm{CacheOffWholeInput, CacheOffImpureBuiltin, CacheOffWithImpureBuiltin, CacheOffWithTarget, CacheOffBuiltinName}
}

// CacheOff says why a set's decisions are not cached: the first place, by
// file and line, whose form turns the cache off.
type CacheOff struct {
	// Form is the construct.
	Form CacheOffForm
	// File and Line are where it is (Line 0: not known).
	File string
	Line int
	// What says what the construct does there, in the policy's own words:
	// "a call of time.now_ns, a built-in that depends on the clock".
	What string
	// More counts the other places that turn the cache off.
	More int

	col int // orders places within a line
}

// String is the reason as a log line or a command prints it:
// "p.rego:7: a call of time.now_ns, ... (impure-builtin)".
func (c *CacheOff) String() string {
	s := fmt.Sprintf("%s (%s)", c.What, c.Form)
	if c.Line > 0 {
		s = fmt.Sprintf("%s:%d: %s", c.File, c.Line, s)
	}
	if c.More > 0 {
		s += fmt.Sprintf("; and %d more", c.More)
	}
	return s
}

// before reports whether c is at an earlier place than d.
func (c *CacheOff) before(d *CacheOff) bool {
	return cmp.Or(cmp.Compare(c.File, d.File), cmp.Compare(c.Line, d.Line), cmp.Compare(c.col, d.col)) < 0
}

// turnOff turns the cache off for the form found at loc, keeping the
// earliest place as the reason and counting the others once each.
func (a *analysis) turnOff(form CacheOffForm, loc *ast.Location, what string) {
	c := &CacheOff{Form: form, What: what}
	if loc != nil {
		c.File, c.Line, c.col = loc.File, loc.Row, loc.Col
	}
	key := fmt.Sprintf("%s\x00%s\x00%d\x00%d", form, c.File, c.Line, c.col)
	if a.offAt[key] {
		return
	}
	a.offAt[key] = true
	switch {
	case a.off == nil:
		a.off = c
		return
	case c.before(a.off):
		c.More, a.off = a.off.More, c
	}
	a.off.More++
}

// wholeInput turns the cache off for a read of the whole input by t.
func (a *analysis) wholeInput(t *ast.Term) {
	what := regoText(t) + " reads the whole input"
	if t.Value.Compare(ast.InputRootRef) == 0 {
		what = "input read whole"
	}
	a.turnOff(CacheOffWholeInput, t.Location, what)
}

// regoText is x as Rego text, cut to a line's worth.
func regoText(x fmt.Stringer) string {
	const width = 80
	s := []rune(x.String())
	if len(s) <= width {
		return string(s)
	}
	return string(s[:width-1]) + "…"
}

package policy

import (
	"crypto/sha256"
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/tidwall/gjson"
)

// Runner pods are highly repetitive: one platform template, many tasks.
// Two pods that differ only where the policies never look (a task id label,
// a generated name) get the same decision. inputReads finds, from the
// policies' syntax, every part of the input they can read; the decision is
// cached under a hash of those parts only. A policy whose reads cannot be
// bounded, or that calls a non-deterministic builtin (time, rand, http.send,
// ...), turns the cache off, so a cached decision is always the decision the
// policies would have made.

// inputReads returns the input paths the modules read, each as a list of
// keys, or ok=false when a read covers the whole input or a builtin is not
// deterministic.
func inputReads(modules map[string]*ast.Module) (paths [][]string, ok bool) {
	ok = true
	seen := map[string]bool{}
	add := func(p []string) {
		if len(p) == 0 {
			ok = false
			return
		}
		k := strings.Join(p, "\x00")
		if !seen[k] {
			seen[k] = true
			paths = append(paths, p)
		}
	}
	for name, m := range modules {
		if strings.HasSuffix(name, "_test.rego") {
			continue
		}
		// object.get(<input ref>, <constant key or path>, default) reads the
		// input ref extended by the key; the bare ref is not read otherwise.
		handled := map[*ast.Term]bool{}
		// A builtin is called in two forms: as a term (x := time.now_ns())
		// and as a statement whose last argument is the output
		// (time.now_ns(x), http.send(req, resp)); the second is an
		// expression whose first term is the operator, not an ast.Call.
		ast.WalkExprs(m, func(e *ast.Expr) bool {
			if e.IsCall() && nondeterministic(e.Operator().String()) {
				ok = false
			}
			return false
		})
		ast.WalkTerms(m, func(t *ast.Term) bool {
			call, isCall := t.Value.(ast.Call)
			if !isCall || len(call) == 0 {
				return false
			}
			fn := call[0].Value.String()
			if nondeterministic(fn) {
				ok = false
			}
			if fn != "object.get" || len(call) != 4 {
				return false
			}
			base, isInput := groundInputPrefix(call[1])
			if !isInput || len(base) != len(call[1].Value.(ast.Ref))-1 {
				return false
			}
			if key, constant := constantPath(call[2]); constant {
				add(append(slices.Clone(base), key...))
				handled[call[1]] = true
			}
			return false
		})
		ast.WalkTerms(m, func(t *ast.Term) bool {
			if handled[t] {
				return false
			}
			if p, isInput := groundInputPrefix(t); isInput {
				add(p)
			}
			return false
		})
	}
	return paths, ok
}

// nondeterministic reports whether OPA marks the named builtin as
// non-deterministic (time.now_ns, rand.intn, http.send, ...).
func nondeterministic(fn string) bool {
	b, known := ast.BuiltinMap[fn]
	return known && b.Nondeterministic
}

// groundInputPrefix returns, for a reference rooted at input, its longest
// prefix of constant string keys.
func groundInputPrefix(t *ast.Term) ([]string, bool) {
	ref, isRef := t.Value.(ast.Ref)
	if !isRef || len(ref) == 0 || !ref[0].Equal(ast.InputRootDocument) {
		return nil, false
	}
	var p []string
	for _, k := range ref[1:] {
		s, isString := k.Value.(ast.String)
		if !isString {
			break
		}
		p = append(p, string(s))
	}
	return p, true
}

// constantPath reads a constant object.get key: a string or an array of strings.
func constantPath(t *ast.Term) ([]string, bool) {
	switch v := t.Value.(type) {
	case ast.String:
		return []string{string(v)}, true
	case *ast.Array:
		var p []string
		for i := range v.Len() {
			s, isString := v.Elem(i).Value.(ast.String)
			if !isString {
				return nil, false
			}
			p = append(p, string(s))
		}
		return p, true
	}
	return nil, false
}

// gjsonPaths turns input paths into gjson paths, escaping gjson's special
// characters in keys.
func gjsonPaths(paths [][]string) []string {
	esc := strings.NewReplacer(".", `\.`, "*", `\*`, "?", `\?`, "|", `\|`, "#", `\#`, "@", `\@`, "!", `\!`, "=", `\=`, "<", `\<`, ">", `\>`, "%", `\%`)
	out := make([]string, len(paths))
	for i, p := range paths {
		keys := make([]string, len(p))
		for j, k := range p {
			keys[j] = esc.Replace(k)
		}
		out[i] = strings.Join(keys, ".")
	}
	return out
}

// projectionKey hashes the input's JSON at each path. encoding/json writes
// struct fields in a fixed order and map keys sorted, so equal values give
// equal bytes; a missing value hashes differently from any present one.
func projectionKey(inputJSON []byte, paths []string) [32]byte {
	h := sha256.New()
	for _, r := range gjson.GetManyBytes(inputJSON, paths...) {
		if r.Exists() {
			h.Write([]byte{1})
			h.Write([]byte(r.Raw))
		} else {
			h.Write([]byte{0})
		}
		h.Write([]byte{0xff})
	}
	var k [32]byte
	h.Sum(k[:0])
	return k
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

package policy

import (
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Rules are the names of the rules the set's policies can deny a pod by:
// the first argument of every violation(...) call whose name is a string
// literal, in the modules that are not tests. A report lists a result for
// each (pass when the pod breaks none of its), so a rule that denied no pod
// still shows.
func (s *Set) Rules() []string {
	var rules []string
	for name, m := range s.modules {
		if strings.HasSuffix(name, "_test.rego") {
			continue
		}
		ast.WalkTerms(m, func(t *ast.Term) bool {
			call, ok := t.Value.(ast.Call)
			if !ok || len(call) < 2 || call[0].String() != "violation" {
				return false
			}
			if rule, ok := call[1].Value.(ast.String); ok && !slices.Contains(rules, string(rule)) {
				rules = append(rules, string(rule))
			}
			return false
		})
	}
	slices.Sort(rules)
	return rules
}

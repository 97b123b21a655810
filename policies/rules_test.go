package policies

import (
	"encoding/json"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/open-policy-agent/opa/v1/ast"
)

// ruleName is what a rule name may be: what the denials metric keeps as a
// label value (webhook/metrics), and the chart's schema lets the platform
// name in its enforcement.
var ruleName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// TestEveryViolationNamesAStableRule checks that every violation the
// shipped policies can make carries its rule's name as written in the
// policy: each `violations contains` is a call of violation (or of a
// function that returns one), whose rule is a string constant of the
// metric's form, never built from the input; and that docs/policy.md lists
// exactly those names, so the platform can name them in its enforcement.
func TestEveryViolationNamesAStableRule(t *testing.T) {
	t.Parallel()
	modules := parse(t)
	// Functions whose value is a violation (shape.rego's host_namespace).
	makers := map[string]bool{"violation": true}
	for _, m := range modules {
		for _, r := range m.Rules {
			if len(r.Head.Args) > 0 && r.Head.Value != nil && callOf(r.Head.Value) == "violation" {
				makers[r.Head.Name.String()] = true
			}
		}
	}
	names := map[string]bool{}
	for file, m := range modules {
		for _, r := range m.Rules {
			if r.Head.Ref().String() == "violations" {
				if r.Head.Key == nil || !makers[callOf(r.Head.Key)] {
					t.Errorf("%s:%d: violations contains %v, not a call of violation(rule, ...)", file, r.Location.Row, r.Head.Key)
				}
			}
		}
		ast.WalkTerms(m, func(term *ast.Term) bool {
			call, ok := term.Value.(ast.Call)
			if !ok || callOf(term) != "violation" || len(call) < 2 {
				return false
			}
			rule, ok := call[1].Value.(ast.String)
			if !ok || !ruleName.MatchString(string(rule)) {
				t.Errorf("%s:%d: violation's rule %v is not a constant kebab-case name", file, term.Location.Row, call[1])
				return false
			}
			names[string(rule)] = true
			return false
		})
	}
	var inPolicies []string
	for n := range names {
		inPolicies = append(inPolicies, n)
	}
	sort.Strings(inPolicies)
	if len(inPolicies) < 10 {
		t.Fatalf("found rules %v, want every rule of the shipped policies", inPolicies)
	}
	if diff := cmp.Diff(inPolicies, documentedRules(t)); diff != "" {
		t.Errorf("rule names in the policies (-) and in docs/policy.md's rule table (+):\n%s", diff)
	}
}

// parse parses the shipped policies, tests left out, by file name.
func parse(t *testing.T) map[string]*ast.Module {
	t.Helper()
	files, err := fs.Glob(FS, "*.rego")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*ast.Module{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		b, err := fs.ReadFile(FS, f)
		if err != nil {
			t.Fatal(err)
		}
		m, err := ast.ParseModuleWithOpts(f, string(b), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			t.Fatal(err)
		}
		out[f] = m
	}
	return out
}

// callOf is the name of the function a term calls, or "".
func callOf(term *ast.Term) string {
	call, ok := term.Value.(ast.Call)
	if !ok || len(call) == 0 {
		return ""
	}
	return call[0].String()
}

// documentedRules are the names in the first column of docs/policy.md's
// table under "### Rule names", sorted.
func documentedRules(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Rule names\n")
	if !ok {
		t.Fatal(`docs/policy.md has no "### Rule names" section`)
	}
	if i := strings.Index(section, "\n#"); i >= 0 {
		section = section[:i]
	}
	cell := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	var out []string
	for _, m := range cell.FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// TestBoundaryRulesDocumented checks that the rules decision.rego never
// relaxes (boundary_rules, and secret-ref-*) are those docs/policy.md's
// boundary table names, and those the chart's schema lets the enforcement
// set to deny only: a boundary rule the schema let through would be
// relaxed by nothing but refused by the webhook at start.
func TestBoundaryRulesDocumented(t *testing.T) {
	t.Parallel()
	var boundary []string
	for _, r := range parse(t)["decision.rego"].Rules {
		if r.Head.Name.String() != "boundary_rules" {
			continue
		}
		set, ok := r.Head.Value.Value.(ast.Set)
		if !ok {
			t.Fatalf("decision.rego: boundary_rules is %v, want a set of rule names", r.Head.Value)
		}
		for _, term := range set.Slice() {
			boundary = append(boundary, string(term.Value.(ast.String)))
		}
	}
	// platform-secret is decided in Go, before the policies
	// (webhook/admission/boundary.go), and is a boundary rule all the same.
	boundary = append(boundary, "platform-secret")
	sort.Strings(boundary)
	if len(boundary) < 7 {
		t.Fatalf("decision.rego's boundary_rules = %v, want the rules of docs/policy.md's boundary table", boundary)
	}
	b, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Boundary rules: deny in every mode\n")
	if !ok {
		t.Fatal(`docs/policy.md has no "### Boundary rules: deny in every mode" section`)
	}
	if i := strings.Index(section, "\n#"); i >= 0 {
		section = section[:i]
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)`( \\(Go\\))? \\|").FindAllStringSubmatch(section, -1) {
		if m[1] != "secret-ref-*" {
			documented = append(documented, m[1])
		}
	}
	sort.Strings(documented)
	if diff := cmp.Diff(boundary, documented); diff != "" {
		t.Errorf("boundary rules in decision.rego (-) and docs/policy.md's boundary table (+):\n%s", diff)
	}

	schema, err := os.ReadFile("../charts/runwarden/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Definitions struct {
			RuleActions struct {
				PatternProperties map[string]struct {
					Const string `json:"const"`
				} `json:"patternProperties"`
			} `json:"ruleActions"`
		} `json:"definitions"`
	}
	if err := json.Unmarshal(schema, &doc); err != nil {
		t.Fatal(err)
	}
	denyOnly := func(rule string) bool {
		for pattern, p := range doc.Definitions.RuleActions.PatternProperties {
			if p.Const == "deny" && regexp.MustCompile(pattern).MatchString(rule) {
				return true
			}
		}
		return false
	}
	for _, rule := range append(documentedRules(t), "platform-secret") {
		want := slices.Contains(boundary, rule) || strings.HasPrefix(rule, "secret-ref-")
		if got := denyOnly(rule); got != want {
			t.Errorf("rule %s: the chart's schema takes deny only: %v, want %v (a boundary rule: %v)", rule, got, want, want)
		}
	}
}

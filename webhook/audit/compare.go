package audit

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
)

// Change is how a subject's outcome changes from the current set to the
// candidate.
type Change string

// Changes, from the most to the least pressing.
const (
	// NewlyDenied: the current set admits the pod, the candidate denies it.
	NewlyDenied Change = "newly denied"
	// DeniedDifferently: both deny it, for other rules or messages.
	DeniedDifferently Change = "denied differently"
	// NoLongerDenied: the current set denies it, the candidate admits it.
	NoLongerDenied Change = "no longer denied"
	// MutatedDifferently: both admit it, with other mutations.
	MutatedDifferently Change = "mutated differently"
	// WarnedDifferently: both admit it alike, with other warnings.
	WarnedDifferently Change = "warned differently"
	// Unchanged: the same outcome, mutations and findings.
	Unchanged Change = "unchanged"
)

// ChangeOrder lists the changes in the order they are shown.
var ChangeOrder = []Change{NewlyDenied, DeniedDifferently, NoLongerDenied, MutatedDifferently, WarnedDifferently, Unchanged}

// Diff is one subject's comparison.
type Diff struct {
	Subject Subject `json:"subject"`
	Change  Change  `json:"change"`
	// Current and Candidate are the two sets' outcomes.
	Current   Outcome `json:"current"`
	Candidate Outcome `json:"candidate"`
	// Added and Removed are, per decision list (Lists), the findings only
	// the candidate has, and those only the current set has.
	Added   map[string][]Finding `json:"added,omitempty"`
	Removed map[string][]Finding `json:"removed,omitempty"`
	// PatchAdded and PatchRemoved are the patch operations only the
	// candidate makes, and those only the current set makes.
	PatchAdded   []jsonpatch.Operation `json:"patchAdded,omitempty"`
	PatchRemoved []jsonpatch.Operation `json:"patchRemoved,omitempty"`
}

// Compare compares one subject's outcomes under the current set and the
// candidate.
func Compare(s Subject, current, candidate Outcome) Diff {
	d := Diff{Subject: s, Current: current, Candidate: candidate, Added: map[string][]Finding{}, Removed: map[string][]Finding{}}
	for _, l := range Lists {
		if a := findingsMinus(candidate.Findings[l], current.Findings[l]); len(a) > 0 {
			d.Added[l] = a
		}
		if r := findingsMinus(current.Findings[l], candidate.Findings[l]); len(r) > 0 {
			d.Removed[l] = r
		}
	}
	d.PatchAdded = patchMinus(candidate.Patch, current.Patch)
	d.PatchRemoved = patchMinus(current.Patch, candidate.Patch)
	changed := func(l string) bool { return len(d.Added[l]) > 0 || len(d.Removed[l]) > 0 }
	switch {
	case candidate.Denied && !current.Denied:
		d.Change = NewlyDenied
	case current.Denied && !candidate.Denied:
		d.Change = NoLongerDenied
	case current.Denied && (changed(ListDeny) || current.Denial != candidate.Denial):
		d.Change = DeniedDifferently
	case len(d.PatchAdded) > 0 || len(d.PatchRemoved) > 0:
		d.Change = MutatedDifferently
	case changed(ListWarnings) || changed(ListDryrun):
		d.Change = WarnedDifferently
	default:
		d.Change = Unchanged
	}
	return d
}

func findingsMinus(a, b []Finding) []Finding {
	var out []Finding
	for _, f := range a {
		if !slices.Contains(b, f) {
			out = append(out, f)
		}
	}
	return out
}

// patchMinus are the operations of a that b does not make alike (same
// operation, path and value).
func patchMinus(a, b []jsonpatch.Operation) []jsonpatch.Operation {
	keys := make([]string, len(b))
	for i, op := range b {
		keys[i] = opKey(op)
	}
	var out []jsonpatch.Operation
	for _, op := range a {
		if !slices.Contains(keys, opKey(op)) {
			out = append(out, op)
		}
	}
	return out
}

func opKey(op jsonpatch.Operation) string {
	v, _ := json.Marshal(op.Value)
	return op.Operation + " " + op.Path + " " + string(v)
}

// RuleChange is what one rule does differently to the subjects, in one
// decision list.
type RuleChange struct {
	Rule string `json:"rule"`
	List string `json:"list"`
	// Added are the subjects the rule now names (denies, warns about);
	// Removed those it no longer names.
	Added   []Ref `json:"added,omitempty"`
	Removed []Ref `json:"removed,omitempty"`
}

// Comparison is the comparison of every subject.
type Comparison struct {
	// CurrentSet and CandidateSet name the two sets (origin and digest).
	CurrentSet   string `json:"currentSet"`
	CandidateSet string `json:"candidateSet"`
	// Diffs are per subject, by namespace, then change, then subject.
	Diffs []Diff `json:"pods"`
	// Rules are per rule and list, sorted.
	Rules []RuleChange `json:"rules"`
}

// NewComparison gathers diffs.
func NewComparison(current, candidate string, diffs []Diff) Comparison {
	c := Comparison{CurrentSet: current, CandidateSet: candidate, Diffs: slices.Clone(diffs)}
	slices.SortStableFunc(c.Diffs, func(a, b Diff) int {
		return cmp.Or(
			cmp.Compare(a.Subject.Ref.Namespace, b.Subject.Ref.Namespace),
			cmp.Compare(slices.Index(ChangeOrder, a.Change), slices.Index(ChangeOrder, b.Change)),
			cmp.Compare(a.Subject.Ref.Name, b.Subject.Ref.Name),
		)
	})
	byRule := map[[2]string]*RuleChange{}
	for _, d := range c.Diffs {
		for _, l := range Lists {
			for _, side := range []struct {
				findings []Finding
				added    bool
			}{{d.Added[l], true}, {d.Removed[l], false}} {
				for _, f := range side.findings {
					rc := byRule[[2]string{f.Rule, l}]
					if rc == nil {
						rc = &RuleChange{Rule: f.Rule, List: l}
						byRule[[2]string{f.Rule, l}] = rc
					}
					refs := &rc.Removed
					if side.added {
						refs = &rc.Added
					}
					if !slices.Contains(*refs, d.Subject.Ref) {
						*refs = append(*refs, d.Subject.Ref)
					}
				}
			}
		}
	}
	for _, rc := range byRule {
		c.Rules = append(c.Rules, *rc)
	}
	slices.SortFunc(c.Rules, func(a, b RuleChange) int {
		return cmp.Or(cmp.Compare(a.Rule, b.Rule), cmp.Compare(slices.Index(Lists, a.List), slices.Index(Lists, b.List)))
	})
	return c
}

// NewDenials counts the subjects the candidate denies and the current set
// admits.
func (c Comparison) NewDenials() int {
	n := 0
	for _, d := range c.Diffs {
		if d.Change == NewlyDenied {
			n++
		}
	}
	return n
}

// FormatOp renders a patch operation on one line: op path value.
func FormatOp(op jsonpatch.Operation) string {
	if op.Operation == "remove" {
		return fmt.Sprintf("%s %s", op.Operation, op.Path)
	}
	v, _ := json.Marshal(op.Value)
	return fmt.Sprintf("%s %s %s", op.Operation, op.Path, v)
}

// CompareAll admits every subject with both evaluators and compares.
func CompareAll(ctx context.Context, current, candidate *Evaluator, subjects []Subject) ([]Diff, error) {
	diffs := make([]Diff, 0, len(subjects))
	for _, s := range subjects {
		cur, err := current.Evaluate(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("the current set: %w", err)
		}
		cand, err := candidate.Evaluate(ctx, s)
		if err != nil {
			return nil, fmt.Errorf("the candidate set: %w", err)
		}
		diffs = append(diffs, Compare(s, cur, cand))
	}
	return diffs, nil
}

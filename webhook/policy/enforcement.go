package policy

import (
	"fmt"
	"slices"
	"strings"
)

// CheckEnforcement checks the platform configuration's enforcement, the
// action per rule and namespace (docs/policy.md): default, rules and
// namespaces, each action deny, warn or dryrun. The policies deny on what
// is not an action; this says where the mistake is, before any pod meets
// it.
func CheckEnforcement(cfg map[string]any) error {
	raw, ok := cfg["enforcement"]
	if !ok {
		return nil
	}
	e, ok := raw.(map[string]any)
	if !ok {
		return fmt.Errorf("enforcement: want an object of default, rules and namespaces, got %T", raw)
	}
	for _, k := range sortedKeys(e) {
		var err error
		switch k {
		case "default":
			err = checkAction("enforcement.default", e[k])
		case "rules":
			err = checkRuleActions("enforcement.rules", e[k])
		case "namespaces":
			err = checkNamespaceActions(e[k])
		default:
			err = fmt.Errorf("enforcement.%s: unknown key; enforcement has default, rules and namespaces", k)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func checkNamespaceActions(v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("enforcement.namespaces: want an object of namespace names to rule actions, got %T", v)
	}
	for _, ns := range sortedKeys(m) {
		if err := checkRuleActions("enforcement.namespaces."+ns, m[ns]); err != nil {
			return err
		}
	}
	return nil
}

func checkRuleActions(path string, v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: want an object of rule names to actions, got %T", path, v)
	}
	for _, rule := range sortedKeys(m) {
		if err := checkAction(path+"."+rule, m[rule]); err != nil {
			return err
		}
		if IsBoundaryRule(rule) && m[rule] != "deny" {
			return fmt.Errorf("%s: %v: the secret-reference rules (secret-ref-*) always deny, they bound which secrets a task may read; "+
				"try a change to them with `runwarden-webhook policy audit` instead", path+"."+rule, m[rule])
		}
	}
	return nil
}

// IsBoundaryRule reports whether no enforcement can relax rule: the
// secret-reference rules (secret-ref-*), which bound which secrets a task
// may have the resolver read (decision.rego's boundary_rule says the same
// to the policies).
func IsBoundaryRule(rule string) bool { return strings.HasPrefix(rule, "secret-ref-") }

func checkAction(path string, v any) error {
	if a, ok := v.(string); ok && slices.Contains(Actions(), a) {
		return nil
	}
	return fmt.Errorf("%s: %v is not an action; use %s", path, v, strings.Join(Actions(), ", "))
}

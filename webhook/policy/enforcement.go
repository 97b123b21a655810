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
		if m[rule] == "deny" {
			continue
		}
		if strings.HasPrefix(rule, "secret-ref-") {
			return fmt.Errorf("%s: %v: the secret-reference rules (secret-ref-*) always deny, they bound which secrets a task may read; "+
				"try a change to them with `runwarden-webhook policy audit` instead", path+"."+rule, m[rule])
		}
		if why, ok := BoundaryRules[rule]; ok {
			return fmt.Errorf("%s: %v: %s is a boundary rule and always denies, whatever the mode: %s; "+
				"try a change to it with `runwarden-webhook policy audit` instead", path+"."+rule, m[rule], rule, why)
		}
	}
	return nil
}

// BoundaryRules are the rules besides secret-ref-* that no enforcement can
// relax, each with why it is the boundary: policies/decision.rego's
// boundary_rules and the chart's schema (ruleActions) name the same, which
// TestBoundaryRulesAgree and TestBoundaryRulesDocumented check, but for
// platform-secret, which the webhook decides in Go before the policies
// (admission.RulePlatformSecret).
var BoundaryRules = map[string]string{
	"allowed-registries":       "it bounds which images run beside the runners' credentials",
	"ephemeral-no-credentials": "a debug container would read the runner's credentials",
	"identity-audience":        "a service account annotation would give runners a token another of the platform's credentials accepts",
	"no-ephemeral-containers":  "a debug container reads main's environment and resolved values, as the kubectl exec refused in every mode would",
	"platform-secret":          "it bounds which pods and containers get the platform's Secrets (decided in Go, before the policies)",
	"platform-service-account": "it bounds which pods run as the runner service account",
	"platform-token-audience":  "it bounds which pods get a token the platform's credentials accept",
}

// DecidedInGo are the boundary rules the webhook decides in Go, before the
// policies (admission.RulePlatformSecret): named in an enforcement, they
// are no misspelling, though no policy denies by them.
var DecidedInGo = []string{"platform-secret"}

// IsBoundaryRule reports whether no enforcement can relax rule: the
// secret-reference rules (secret-ref-*), which bound which secrets a task
// may have the resolver read, and BoundaryRules (decision.rego's
// boundary_rule says the same to the policies).
func IsBoundaryRule(rule string) bool {
	_, ok := BoundaryRules[rule]
	return ok || strings.HasPrefix(rule, "secret-ref-")
}

func checkAction(path string, v any) error {
	if a, ok := v.(string); ok && slices.Contains(Actions(), a) {
		return nil
	}
	return fmt.Errorf("%s: %v is not an action; use %s", path, v, strings.Join(Actions(), ", "))
}

// UnknownEnforcedRules names, sorted and each once, the rules the
// enforcement sets an action for (in enforcement.rules or a namespace's)
// that are not among rules, the rules the policies in force can deny by
// (Set.Rules): most likely a misspelling, which leaves the rule it meant at
// its default action. Not an error: a policy may name its rules in a way
// Set.Rules does not see, and a reload may drop a rule the configuration
// still names.
func UnknownEnforcedRules(cfg map[string]any, rules []string) []string {
	e, _ := cfg["enforcement"].(map[string]any)
	named := map[string]bool{}
	add := func(v any) {
		m, _ := v.(map[string]any)
		for rule := range m {
			named[rule] = true
		}
	}
	add(e["rules"])
	if ns, ok := e["namespaces"].(map[string]any); ok {
		for _, v := range ns {
			add(v)
		}
	}
	var unknown []string
	for _, rule := range sortedKeys(named) {
		if !slices.Contains(rules, rule) && !slices.Contains(DecidedInGo, rule) {
			unknown = append(unknown, rule)
		}
	}
	return unknown
}

// UnknownRulesMessage says what UnknownEnforcedRules found.
func UnknownRulesMessage(unknown []string) string {
	return fmt.Sprintf("the platform configuration's enforcement names %s, which no policy in force denies by "+
		"(misspelt?): the rule meant keeps its default action", strings.Join(unknown, ", "))
}

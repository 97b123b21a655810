package policy

import (
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/runwarden/runwarden/policies"
)

func TestCheckEnforcement(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     map[string]any
		wantErr string
	}{
		{name: "none", cfg: map[string]any{"mode": "audit"}},
		{name: "every part", cfg: map[string]any{"enforcement": map[string]any{
			"default":    "warn",
			"rules":      map[string]any{"no-privileged": "deny", "resources-required": "dryrun", "allowed-registries": "deny"},
			"namespaces": map[string]any{"team-a": map[string]any{"resources-required": "deny", "platform-secret": "deny"}},
		}}},
		{name: "unknown default", cfg: map[string]any{"enforcement": map[string]any{"default": "audit"}},
			wantErr: "enforcement.default: audit is not an action; use deny, warn, dryrun"},
		{name: "unknown rule action", cfg: map[string]any{"enforcement": map[string]any{"rules": map[string]any{"no-privileged": "off"}}},
			wantErr: "enforcement.rules.no-privileged: off is not an action; use deny, warn, dryrun"},
		{name: "action in another case", cfg: map[string]any{"enforcement": map[string]any{"rules": map[string]any{"no-privileged": "DryRun"}}},
			wantErr: "enforcement.rules.no-privileged: DryRun is not an action; use deny, warn, dryrun"},
		{name: "unknown namespace action", cfg: map[string]any{"enforcement": map[string]any{"namespaces": map[string]any{"team-a": map[string]any{"no-privileged": true}}}},
			wantErr: "enforcement.namespaces.team-a.no-privileged: true is not an action; use deny, warn, dryrun"},
		{name: "namespace without rules", cfg: map[string]any{"enforcement": map[string]any{"namespaces": map[string]any{"team-a": "dryrun"}}},
			wantErr: "enforcement.namespaces.team-a: want an object of rule names to actions, got string"},
		{name: "namespaces not an object", cfg: map[string]any{"enforcement": map[string]any{"namespaces": []any{}}},
			wantErr: "enforcement.namespaces: want an object of namespace names to rule actions, got []interface {}"},
		{name: "a secret-reference rule set to deny", cfg: map[string]any{"enforcement": map[string]any{"rules": map[string]any{"secret-ref-name": "deny"}}}},
		{name: "a secret-reference rule relaxed", cfg: map[string]any{"enforcement": map[string]any{"rules": map[string]any{"secret-ref-name": "dryrun"}}},
			wantErr: "enforcement.rules.secret-ref-name: dryrun: the secret-reference rules (secret-ref-*) always deny, they bound which secrets a task may read; " +
				"try a change to them with `runwarden-webhook policy audit` instead"},
		{name: "a secret-reference rule relaxed in a namespace", cfg: map[string]any{"enforcement": map[string]any{"namespaces": map[string]any{"team-a": map[string]any{"secret-ref-pattern": "warn"}}}},
			wantErr: "enforcement.namespaces.team-a.secret-ref-pattern: warn: the secret-reference rules (secret-ref-*) always deny, they bound which secrets a task may read; " +
				"try a change to them with `runwarden-webhook policy audit` instead"},
		{name: "the registry allow-list relaxed", cfg: map[string]any{"enforcement": map[string]any{"rules": map[string]any{"allowed-registries": "dryrun"}}},
			wantErr: "enforcement.rules.allowed-registries: dryrun: allowed-registries is a boundary rule and always denies, whatever the mode: " +
				"it bounds which images run beside the runners' credentials; try a change to it with `runwarden-webhook policy audit` instead"},
		{name: "debug containers relaxed in a namespace", cfg: map[string]any{"enforcement": map[string]any{"namespaces": map[string]any{"team-a": map[string]any{"no-ephemeral-containers": "warn"}}}},
			wantErr: "enforcement.namespaces.team-a.no-ephemeral-containers: warn: no-ephemeral-containers is a boundary rule and always denies, whatever the mode: " +
				"a debug container reads main's environment and resolved values, as the kubectl exec refused in every mode would; try a change to it with `runwarden-webhook policy audit` instead"},
		{name: "the platform's Secrets relaxed", cfg: map[string]any{"enforcement": map[string]any{"rules": map[string]any{"platform-secret": "warn"}}},
			wantErr: "enforcement.rules.platform-secret: warn: platform-secret is a boundary rule and always denies, whatever the mode: " +
				"it bounds which pods and containers get the platform's Secrets (decided in Go, before the policies); try a change to it with `runwarden-webhook policy audit` instead"},
		{name: "unknown key", cfg: map[string]any{"enforcement": map[string]any{"rule": map[string]any{}}},
			wantErr: "enforcement.rule: unknown key; enforcement has default, rules and namespaces"},
		{name: "not an object", cfg: map[string]any{"enforcement": "dryrun"},
			wantErr: "enforcement: want an object of default, rules and namespaces, got string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := CheckEnforcement(tt.cfg)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.wantErr {
				t.Errorf("CheckEnforcement error = %q, want %q", got, tt.wantErr)
			}
		})
	}
}

func TestUnknownEnforcedRules(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules := s.Rules()
	tests := []struct {
		name string
		cfg  map[string]any
		want []string
	}{
		{"no enforcement", map[string]any{}, nil},
		{"known rules only", map[string]any{"enforcement": map[string]any{
			"default": "warn", "rules": map[string]any{"allowed-registries": "deny"},
			"namespaces": map[string]any{"team-a": map[string]any{"resources-required": "dryrun"}},
		}}, nil},
		{"a boundary rule decided in Go", map[string]any{"enforcement": map[string]any{"rules": map[string]any{"platform-secret": "deny"}}}, nil},
		{"misspelt, in rules and in namespaces, each once", map[string]any{"enforcement": map[string]any{
			"rules": map[string]any{"allowed-registry": "warn", "allowed-registries": "deny"},
			"namespaces": map[string]any{
				"team-a": map[string]any{"resource-required": "dryrun", "allowed-registry": "deny"},
				"team-b": map[string]any{},
			},
		}}, []string{"allowed-registry", "resource-required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := UnknownEnforcedRules(tt.cfg, rules); !slices.Equal(got, tt.want) {
				t.Errorf("UnknownEnforcedRules = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestBoundaryRulesAgree checks that IsBoundaryRule says of every rule of
// the shipped policies, and of every name in BoundaryRules, what
// decision.rego's boundary_rule says: the webhook's start-up check refuses
// relaxing exactly the rules the policies never relax.
func TestBoundaryRulesAgree(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	names := s.Rules()
	inGo := DecidedInGo
	for rule := range BoundaryRules {
		if !slices.Contains(names, rule) && !slices.Contains(inGo, rule) {
			t.Errorf("BoundaryRules names %s, which no shipped policy denies by", rule)
		}
	}
	files, err := fs.Glob(policies.FS, "*.rego")
	if err != nil {
		t.Fatal(err)
	}
	var opts []func(*rego.Rego)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		b, err := policies.FS.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, rego.Module(f, string(b)))
	}
	q, err := rego.New(append(opts, rego.Query("data.runwarden.admission.boundary_rule(input.rule)"))...).PrepareForEval(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	boundary := 0
	for _, rule := range names {
		rs, err := q.Eval(t.Context(), rego.EvalInput(map[string]any{"rule": rule}))
		if err != nil {
			t.Fatal(err)
		}
		inRego := len(rs) == 1 && rs[0].Expressions[0].Value == true
		if inRego != IsBoundaryRule(rule) {
			t.Errorf("rule %s: boundary in decision.rego %v, IsBoundaryRule %v", rule, inRego, IsBoundaryRule(rule))
		}
		if inRego {
			boundary++
		}
	}
	if boundary < len(BoundaryRules)-len(inGo)+1 {
		t.Errorf("%d boundary rules among %v, want every one of BoundaryRules and secret-ref-*", boundary, names)
	}
}

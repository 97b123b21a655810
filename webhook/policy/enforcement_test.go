package policy

import (
	"testing"
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
			"rules":      map[string]any{"no-privileged": "deny", "allowed-registries": "dryrun"},
			"namespaces": map[string]any{"team-a": map[string]any{"allowed-registries": "deny"}},
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

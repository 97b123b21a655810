package runwarden.admission_test

import data.runwarden.admission

# A pod that breaks two always-on rules: no-host-namespaces (hostPID) and
# no-privileged (container main).
breaking(cfg) := json.patch(input_with(cfg), [
	{"op": "add", "path": "/pod/spec/hostPID", "value": true},
	{"op": "add", "path": "/pod/spec/containers/0/securityContext", "value": {"privileged": true}},
])

# acted is the rule and action of every violation of a decision, whatever
# list it is in.
acted(d) := sorted if {
	all := array.concat(array.concat(d.deny, d.warn), d.dryrun)
	sorted := sort([[v.rule, v.action] | some v in all])
}

test_enforce_is_the_default if {
	d := admission.decision with input as breaking({})
	[v.rule | some v in d.deny] == ["no-host-namespaces", "no-privileged"]
	every v in d.deny {
		v.action == "deny"
	}
	d.warn == []
	d.dryrun == []
	d.warnings == []
}

test_audit_mode_warns_every_rule if {
	d := admission.decision with input as breaking({"mode": "audit"})
	d.deny == []
	d.dryrun == []
	acted(d) == [["no-host-namespaces", "warn"], ["no-privileged", "warn"]]
	d.warnings == [
		"audit: would deny: no-host-namespaces: the pod uses the host's namespaces (hostPID)",
		"audit: would deny: no-privileged: container \"main\" is privileged",
	]
}

test_dryrun_default_admits_silently if {
	d := admission.decision with input as breaking({"enforcement": {"default": "dryrun"}})
	d.deny == []
	d.warn == []
	d.warnings == []
	acted(d) == [["no-host-namespaces", "dryrun"], ["no-privileged", "dryrun"]]
	[v.message | some v in d.dryrun] == [
		"no-host-namespaces: the pod uses the host's namespaces (hostPID)",
		"no-privileged: container \"main\" is privileged",
	]
}

# enforcement.default wins over mode.
test_enforcement_default_beats_mode if {
	d := admission.decision with input as breaking({"mode": "audit", "enforcement": {"default": "deny"}})
	acted(d) == [["no-host-namespaces", "deny"], ["no-privileged", "deny"]]
	d.warnings == []
}

test_rule_setting_beats_the_default if {
	tests := [
		{"cfg": {"enforcement": {"rules": {"no-host-namespaces": "warn"}}}, "want": [["no-host-namespaces", "warn"], ["no-privileged", "deny"]]},
		{"cfg": {"enforcement": {"rules": {"no-host-namespaces": "dryrun"}}}, "want": [["no-host-namespaces", "dryrun"], ["no-privileged", "deny"]]},
		{"cfg": {"enforcement": {"default": "dryrun", "rules": {"no-privileged": "deny"}}}, "want": [["no-host-namespaces", "dryrun"], ["no-privileged", "deny"]]},
		{"cfg": {"mode": "audit", "enforcement": {"rules": {"no-privileged": "deny"}}}, "want": [["no-host-namespaces", "warn"], ["no-privileged", "deny"]]},
	]
	every tc in tests {
		acted(admission.decision) == tc.want with input as breaking(tc.cfg)
	}
}

test_namespace_setting_beats_the_rule_setting if {
	rules := {"no-host-namespaces": "dryrun", "no-privileged": "dryrun"}
	tests := [
		# The pod's namespace is team-a.
		{"namespaces": {"team-a": {"no-privileged": "deny"}}, "want": [["no-host-namespaces", "dryrun"], ["no-privileged", "deny"]]},
		{"namespaces": {"team-a": {"no-host-namespaces": "warn"}}, "want": [["no-host-namespaces", "warn"], ["no-privileged", "dryrun"]]},
		# Another namespace's setting does not apply.
		{"namespaces": {"team-b": {"no-privileged": "deny"}}, "want": [["no-host-namespaces", "dryrun"], ["no-privileged", "dryrun"]]},
	]
	every tc in tests {
		acted(admission.decision) == tc.want with input as breaking({"enforcement": {"default": "warn", "rules": rules, "namespaces": tc.namespaces}})
	}
}

test_namespace_setting_beats_the_default if {
	cfg := {"mode": "audit", "enforcement": {"namespaces": {"team-a": {"no-privileged": "deny"}}}}
	acted(admission.decision) == [["no-host-namespaces", "warn"], ["no-privileged", "deny"]] with input as breaking(cfg)
}

# What is not an action denies: the chart's schema and the webhook refuse
# it, and a configuration that slipped past them must not relax a rule.
test_unknown_action_denies if {
	tests := [
		{"default": "audit"},
		{"rules": {"no-privileged": "off", "no-host-namespaces": "Dryrun"}},
		{"namespaces": {"team-a": {"no-privileged": "allow", "no-host-namespaces": ""}}},
	]
	every e in tests {
		acted(admission.decision) == [["no-host-namespaces", "deny"], ["no-privileged", "deny"]] with input as breaking({"enforcement": e})
	}
}

# A namespace's tenants write its annotations and labels: nothing they
# write changes a rule's action, only the platform configuration does.
test_namespace_annotations_cannot_change_the_action if {
	inp := json.patch(breaking({}), [
		{"op": "add", "path": "/namespace/annotations", "value": {
			"runwarden.dev/enforcement": "dryrun",
			"runwarden.dev/enforcement.no-privileged": "dryrun",
			"runwarden.dev/no-privileged": "warn",
			"runwarden.dev/mode": "audit",
			"mode": "audit",
		}},
		{"op": "add", "path": "/namespace/labels", "value": {"runwarden.dev/enforcement": "dryrun", "runwarden.dev/mode": "audit"}},
	])
	d := admission.decision with input as inp
	acted(d) == [["no-host-namespaces", "deny"], ["no-privileged", "deny"]]
	d.warnings == []
}

# A pod naming a secret its namespace's patterns do not name, under a
# configuration that relaxes everything it can.
unnamed_secret(cfg) := json.patch(input_with(object.union(all_stores, cfg)), [
	{"op": "replace", "path": "/secretRefs", "value": [ref("ssm", "prod/db", "")]},
	{"op": "add", "path": "/pod/spec/hostPID", "value": true},
])

test_secret_reference_rules_always_deny if {
	relaxed := [
		{"mode": "audit"},
		{"enforcement": {"default": "dryrun"}},
		{"enforcement": {"rules": {"secret-ref-name": "dryrun"}}},
		{"enforcement": {"namespaces": {"team-a": {"secret-ref-name": "warn"}}}},
	]
	every cfg in relaxed {
		d := admission.decision with input as unnamed_secret(cfg)
		[[v.rule, v.action] | some v in d.deny; startswith(v.rule, "secret-ref-")] == [["secret-ref-name", "deny"]]
		[v | some v in array.concat(d.warn, d.dryrun); startswith(v.rule, "secret-ref-")] == []
	}
}

test_relaxing_the_default_still_relaxes_the_shape_rules if {
	d := admission.decision with input as unnamed_secret({"enforcement": {"default": "dryrun"}})
	[[v.rule, v.action] | some v in d.dryrun] == [["no-host-namespaces", "dryrun"]]
}

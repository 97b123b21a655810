# Scheduling: runner pods go to the runner node pool, with per-namespace
# overrides, and are not evicted by autoscalers while they run.
package runwarden.admission

sched := object.get(cfg, "scheduling", {})

# A namespace may choose its own pool: annotation
# runwarden.dev/node-selector: "key=value,key2=value2". One that does not
# read so (no "=", a key twice, a key or value that is not a valid label key
# or value, which the API server would refuse in the pod) is a warning, and
# the configured node selector stays.
ns_selector_text := ns_annotations["runwarden.dev/node-selector"]

ns_selector_pairs := [split(p, "=") |
	some raw in split(ns_selector_text, ",")
	p := trim_space(raw)
	p != ""
]

ns_selector_valid if {
	count(ns_selector_pairs) > 0
	every kv in ns_selector_pairs {
		count(kv) == 2
		label_key(trim_space(kv[0]))
		label_value(trim_space(kv[1]))
	}
	keys := [trim_space(kv[0]) | some kv in ns_selector_pairs]
	count(keys) == count({k | some k in keys})
}

ns_node_selector := {trim_space(kv[0]): trim_space(kv[1]) | some kv in ns_selector_pairs} if ns_selector_valid

default effective_node_selector := {}

effective_node_selector := ns_node_selector if ns_selector_valid

effective_node_selector := object.get(sched, "nodeSelector", {}) if not ns_selector_valid

warning contains sprintf("namespace annotation runwarden.dev/node-selector is not \"key=value,...\" with distinct label keys and label values: %q; the configured node selector is used", [ns_selector_text]) if {
	ns_selector_text
	not ns_selector_valid
}

node_selector contains [k, v] if some k, v in effective_node_selector

# Tolerations from the configuration, and from the namespace annotation
# runwarden.dev/tolerations (a JSON list), which adds to them.
tolerations contains t if some t in object.get(sched, "tolerations", [])

tolerations contains t if {
	some i, t in ns_tolerations
	not i in bad_ns_tolerations
}

ns_tolerations := ts if {
	ts := json.unmarshal(ns_annotations["runwarden.dev/tolerations"])
	is_array(ts)
}

# An item is kept only if the API server would accept it in a pod (the rules
# of Kubernetes' ValidateTolerations) and Go can decode it: one it would
# refuse, or a tolerationSeconds of 1.5, would fail every runner pod of the
# namespace. toleration_problem holds [item index, why] for each rule broken.
bad_ns_tolerations := {i | some [i, _] in toleration_problem}

toleration_fields := {"key", "operator", "value", "effect", "tolerationSeconds"}

toleration_problem contains [i, "not an object"] if {
	some i, t in ns_tolerations
	not is_object(t)
}

toleration_problem contains [i, sprintf("no field %q", [k])] if {
	some i, t in ns_tolerations
	is_object(t)
	some k, _ in t
	not k in toleration_fields
}

toleration_problem contains [i, sprintf("%s is not a string", [k])] if {
	some i, t in ns_tolerations
	some k in ["key", "operator", "value", "effect"]
	v := t[k]
	not is_string(v)
}

toleration_problem contains [i, "tolerationSeconds is not a whole number of seconds"] if {
	some i, t in ns_tolerations
	v := t.tolerationSeconds
	not whole_seconds(v)
}

toleration_problem contains [i, sprintf("key %q is not a label key", [t.key])] if {
	some i, t in ns_tolerations
	is_string(t.key)
	t.key != ""
	not label_key(t.key)
}

toleration_problem contains [i, "an empty key needs operator Exists"] if {
	some i, t in ns_tolerations
	is_object(t)
	object.get(t, "key", "") == ""
	object.get(t, "operator", "") != "Exists"
}

toleration_problem contains [i, sprintf("operator %q is not Equal or Exists", [t.operator])] if {
	some i, t in ns_tolerations
	is_string(t.operator)
	not t.operator in {"", "Equal", "Exists"}
}

toleration_problem contains [i, sprintf("value %q is not a label value", [t.value])] if {
	some i, t in ns_tolerations
	object.get(t, "operator", "") in {"", "Equal"}
	is_string(t.value)
	not label_value(t.value)
}

toleration_problem contains [i, "operator Exists takes no value"] if {
	some i, t in ns_tolerations
	t.operator == "Exists"
	object.get(t, "value", "") != ""
}

toleration_problem contains [i, sprintf("effect %q is not NoSchedule, PreferNoSchedule or NoExecute", [t.effect])] if {
	some i, t in ns_tolerations
	is_string(t.effect)
	not t.effect in {"", "NoSchedule", "PreferNoSchedule", "NoExecute"}
}

toleration_problem contains [i, "tolerationSeconds needs effect NoExecute"] if {
	some i, t in ns_tolerations
	is_object(t)
	"tolerationSeconds" in object.keys(t)
	object.get(t, "effect", "") != "NoExecute"
}

# An int64, written as one: Go decodes neither 1.5 nor 30.0 nor 1e3 into it.
whole_seconds(v) if {
	is_number(v)
	regex.match(`^-?(0|[1-9][0-9]*)$`, json.marshal(v))
	v >= -9223372036854775808
	v <= 9223372036854775807
}

warning contains sprintf("namespace annotation runwarden.dev/tolerations: %s is not a toleration the API server accepts (%s); left out", [json.marshal(ns_tolerations[i]), concat("; ", sort(whys))]) if {
	some i in bad_ns_tolerations
	whys := [why | some [j, why] in toleration_problem; j == i]
}

# Label keys and values as Kubernetes validates them: a key is a name of at
# most 63 characters, with an optional DNS subdomain prefix and "/"; a value
# is at most 63 characters, and may be empty.
label_key(k) if {
	parts := split(k, "/")
	count(parts) == 1
	label_name(parts[0])
}

label_key(k) if {
	[prefix, name] := split(k, "/")
	count(prefix) <= 253
	regex.match(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`, prefix)
	label_name(name)
}

label_name(n) if {
	count(n) <= 63
	regex.match(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`, n)
}

label_value(v) if {
	count(v) <= 63
	regex.match(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`, v)
}

# Required node affinity: match expressions every node term must hold.
node_affinity contains e if some e in object.get(sched, "requiredNodeAffinity", [])

# Runners must not be evicted halfway through a deployment.
pod_annotations contains ["cluster-autoscaler.kubernetes.io/safe-to-evict", "false"] if enabled(["scheduling", "doNotEvict"])

pod_annotations contains ["karpenter.sh/do-not-disrupt", "true"] if enabled(["scheduling", "doNotEvict"])

warning contains sprintf("namespace annotation runwarden.dev/tolerations is not a JSON list of tolerations: %s", [ns_annotations["runwarden.dev/tolerations"]]) if {
	ns_annotations["runwarden.dev/tolerations"]
	not is_array(json.unmarshal(ns_annotations["runwarden.dev/tolerations"]))
}

# Scheduling: runner pods go to the runner node pool, with per-namespace
# overrides, and are not evicted by autoscalers while they run.
package runwarden.admission

sched := object.get(cfg, "scheduling", {})

# A namespace may choose its own pool: annotation
# runwarden.dev/node-selector: "key=value,key2=value2". One that does not
# read so (no "=", an empty key, a key twice) is a warning, and the
# configured node selector stays.
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
		trim_space(kv[0]) != ""
	}
	keys := [trim_space(kv[0]) | some kv in ns_selector_pairs]
	count(keys) == count({k | some k in keys})
}

ns_node_selector := {trim_space(kv[0]): trim_space(kv[1]) | some kv in ns_selector_pairs} if ns_selector_valid

default effective_node_selector := {}

effective_node_selector := ns_node_selector if ns_selector_valid

effective_node_selector := object.get(sched, "nodeSelector", {}) if not ns_selector_valid

warning contains sprintf("namespace annotation runwarden.dev/node-selector is not \"key=value,...\" with distinct keys: %q; the configured node selector is used", [ns_selector_text]) if {
	ns_selector_text
	not ns_selector_valid
}

node_selector contains [k, v] if some k, v in effective_node_selector

# Tolerations from the configuration, and from the namespace annotation
# runwarden.dev/tolerations (a JSON list), which adds to them.
tolerations contains t if some t in object.get(sched, "tolerations", [])

tolerations contains t if {
	some t in ns_tolerations
	valid_toleration(t)
}

ns_tolerations := ts if {
	ts := json.unmarshal(ns_annotations["runwarden.dev/tolerations"])
	is_array(ts)
}

toleration_strings := {"key", "operator", "value", "effect"}

valid_toleration(t) if {
	is_object(t)
	every k, v in t {
		valid_toleration_field(k, v)
	}
}

valid_toleration_field(k, v) if {
	k in toleration_strings
	is_string(v)
}

valid_toleration_field("tolerationSeconds", v) if is_number(v)

warning contains sprintf("namespace annotation runwarden.dev/tolerations: %s is not a toleration (an object of key, operator, value, effect, tolerationSeconds); left out", [json.marshal(t)]) if {
	some t in ns_tolerations
	not valid_toleration(t)
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

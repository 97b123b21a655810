# Scheduling: runner pods go to the runner node pool, with per-namespace
# overrides, and are not evicted by autoscalers while they run.
package runwarden.admission

sched := object.get(cfg, "scheduling", {})

# A namespace may choose its own pool: annotation
# runwarden.dev/node-selector: "key=value,key2=value2".
ns_node_selector := {k: v |
	some pair in split(ns_annotations["runwarden.dev/node-selector"], ",")
	[k, v] := split(trim_space(pair), "=")
} if ns_annotations["runwarden.dev/node-selector"]

default effective_node_selector := {}

effective_node_selector := ns_node_selector if count(ns_node_selector) > 0

effective_node_selector := object.get(sched, "nodeSelector", {}) if not ns_node_selector

node_selector contains [k, v] if some k, v in effective_node_selector

# Tolerations from the configuration, and from the namespace annotation
# runwarden.dev/tolerations (a JSON list), which adds to them.
tolerations contains t if some t in object.get(sched, "tolerations", [])

tolerations contains t if {
	ts := json.unmarshal(ns_annotations["runwarden.dev/tolerations"])
	is_array(ts)
	some t in ts
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

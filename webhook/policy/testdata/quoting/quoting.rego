# A set whose every rule quotes what the pod carries, in every way a policy
# can: as written, by sprintf's %v of the containing object, by %q, by
# json.marshal, as a substring, URL-encoded, and in the rule, container and
# field names too. The redaction tests (webhook/policy, admission, audit)
# run it on a pod that holds a secret in each such field; the list each
# quote goes to is the configuration's "list" (deny, warn or dryrun), and
# each is also a warning.
package runwarden.admission

pod := input.pod

containers := array.concat(
	array.concat(object.get(pod.spec, "initContainers", []), pod.spec.containers),
	object.get(pod.spec, "ephemeralContainers", []),
)

# Every string the pod carries in a field a rule may quote.
values contains e.value if {
	some c in containers
	some e in object.get(c, "env", [])
	e.value
}

values contains a if {
	some c in containers
	some a in array.concat(object.get(c, "command", []), object.get(c, "args", []))
}

values contains a if {
	some c in containers
	some a in object.get(c, ["livenessProbe", "exec", "command"], [])
}

values contains v if some v in object.get(pod.metadata, "annotations", {})

values contains v if some v in object.get(pod.metadata, "labels", {})

quotes contains sprintf("raw %s", [v]) if some v in values

quotes contains sprintf("quoted %q", [v]) if some v in values

quotes contains sprintf("in an array %v", [[v]]) if some v in values

quotes contains sprintf("marshalled %s", [json.marshal(v)]) if some v in values

quotes contains sprintf("marshalled twice %s", [json.marshal({"v": json.marshal(v)})]) if some v in values

quotes contains sprintf("part %s", [substring(v, count(v) - 17, 16)]) if {
	some v in values
	count(v) > 17
}

quotes contains sprintf("url-encoded %s", [urlquery.encode(v)]) if some v in values

quotes contains sprintf("after = %s", [split(v, "=")[1]]) if {
	some v in values
	contains(v, "=")
}

quotes contains sprintf("before @ %s", [split(v, "@")[0]]) if {
	some v in values
	contains(v, "@")
}

quotes contains sprintf("container %v", [c]) if some c in containers

quotes contains sprintf("container %s", [json.marshal(c)]) if some c in containers

quotes contains sprintf("metadata %v", [pod.metadata]) if true

quotes contains sprintf("metadata %s", [json.marshal(pod.metadata)]) if true

list := object.get(object.get(input, "config", {}), "list", "deny")

violations := [{"rule": concat("/", ["quote", q]), "container": q, "field": q, "message": q, "action": list} | some q in quotes]

decision := {
	"deny": [v | some v in violations; list == "deny"],
	"warn": [v | some v in violations; list == "warn"],
	"dryrun": [v | some v in violations; list == "dryrun"],
	"warnings": sort([q | some q in quotes]),
	"mutations": {},
}

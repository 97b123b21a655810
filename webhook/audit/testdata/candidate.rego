package runwarden.admission

# A candidate rule: no runner may run with DEBUG set.
violations contains violation("no-debug-env", c.name, sprintf("env %s", [e.name]), "DEBUG is set; remove it") if {
	some c in input.pod.spec.containers
	some e in c.env
	e.name == "DEBUG"
}

# A candidate mutation: pods of team blue carry their cost center.
pod_annotations contains ["runwarden.dev/cost-center", "blue"] if {
	input.pod.metadata.labels.team == "blue"
}

# Secret references in env values (${ssm:...}, ${gcp:...},
# ${azure:name@vault}, ${vault:path.key@namespace}): Go parses them into
# input.secretRefs; these rules allow or deny them per namespace.
package runwarden.admission

refs_cfg := object.get(cfg, "secretRefs", {})

# The stores a namespace may read: annotation runwarden.dev/secret-stores
# ("ssm,vault"), else the configuration's allowedStores, else all.
default allowed_stores := {"ssm", "gcp", "azure", "vault"}

allowed_stores := {trim_space(s) | some s in split(ns_annotations["runwarden.dev/secret-stores"], ",")} if {
	ns_annotations["runwarden.dev/secret-stores"]
}

allowed_stores := {s | some s in refs_cfg.allowedStores} if {
	not ns_annotations["runwarden.dev/secret-stores"]
	refs_cfg.allowedStores
}

# The secret names a namespace may read, as globs with "/" as separator:
# annotation runwarden.dev/secret-patterns ("team-a/*,shared/*"), else the
# configuration's allowedPatterns, else any.
default allowed_patterns := ["**"]

allowed_patterns := [trim_space(p) | some p in split(ns_annotations["runwarden.dev/secret-patterns"], ",")] if {
	ns_annotations["runwarden.dev/secret-patterns"]
}

allowed_patterns := refs_cfg.allowedPatterns if {
	not ns_annotations["runwarden.dev/secret-patterns"]
	refs_cfg.allowedPatterns
}

violations contains violation("secret-ref-malformed", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: %s",
	[ref.container, ref.env, ref.error],
)) if {
	is_runner
	some ref in object.get(input, "secretRefs", [])
	ref.error != ""
}

violations contains violation("secret-ref-store", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: namespace %s may not read from store %q (allowed: %s)",
	[ref.container, ref.env, input.namespace.name, ref.store, concat(", ", sort([s | some s in allowed_stores]))],
)) if {
	is_runner
	some ref in object.get(input, "secretRefs", [])
	ref.error == ""
	not ref.store in allowed_stores
}

violations contains violation("secret-ref-name", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: namespace %s may not read secret %q (allowed: %s)",
	[ref.container, ref.env, input.namespace.name, ref.name, concat(", ", allowed_patterns)],
)) if {
	is_runner
	some ref in object.get(input, "secretRefs", [])
	ref.error == ""
	ref.store in allowed_stores
	not name_allowed(ref.name)
}

name_allowed(name) if {
	some p in allowed_patterns
	glob.match(p, ["/"], name)
}

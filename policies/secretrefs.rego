# Secret references in env values (${ssm:...}, ${gcp:...},
# ${azure:name@vault}, ${vault:path.key@namespace}): Go parses them into
# input.secretRefs; these rules allow or deny them per namespace.
#
# A reference is allowed only when a pattern of its namespace names its
# whole address: the store, the scope the name lives in (Vault namespace,
# Azure key vault, GCP project) and the name. A namespace that names no
# pattern may read nothing (docs/secrets.md).
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

# The addresses a namespace may read, as globs over "<store>:<scope>:<name>"
# (ssm: "ssm:<name>") with "/" and ":" as separators: annotation
# runwarden.dev/secret-patterns ("vault:team-a:secret/team-a/*,..."), else the
# configuration's allowedPatterns, else none.
default allowed_patterns := []

allowed_patterns := [trim_space(p) | some p in split(ns_annotations["runwarden.dev/secret-patterns"], ","); trim_space(p) != ""] if {
	ns_annotations["runwarden.dev/secret-patterns"]
}

allowed_patterns := refs_cfg.allowedPatterns if {
	not ns_annotations["runwarden.dev/secret-patterns"]
	refs_cfg.allowedPatterns
}

# valid_refs are the pod's references Go parsed without error.
valid_refs contains ref if {
	some ref in object.get(input, "secretRefs", [])
	ref.error == ""
}

# ref_address is the whole address of a reference's secret.
ref_address(ref) := concat(":", ["vault", ref.vault, ref.name]) if ref.store == "vault"

ref_address(ref) := concat(":", ["azure", ref.vault, ref.name]) if ref.store == "azure"

ref_address(ref) := concat(":", ["ssm", ref.name]) if ref.store == "ssm"

ref_address(ref) := concat(":", ["gcp", gcp_project(ref), gcp_secret(ref)]) if ref.store == "gcp"

# A GCP reference names its project (projects/<p>/secrets/<s>[/versions/<v>],
# a form Go checks), else it is the configured project's.
gcp_project(ref) := split(ref.name, "/")[1] if startswith(ref.name, "projects/")

gcp_project(ref) := object.get(cfg, ["secretStores", "gcp", "project"], "") if not startswith(ref.name, "projects/")

gcp_secret(ref) := split(ref.name, "/")[3] if startswith(ref.name, "projects/")

gcp_secret(ref) := ref.name if not startswith(ref.name, "projects/")

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
	some ref in valid_refs
	not ref.store in allowed_stores
}

violations contains violation("secret-ref-name", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: namespace %s may not read %s (%s; allowed: %s)",
	[ref.container, ref.env, input.namespace.name, ref.raw, ref_address(ref), patterns_text],
)) if {
	is_runner
	some ref in valid_refs
	ref.store in allowed_stores
	not address_allowed(ref_address(ref))
}

patterns_text := concat(", ", allowed_patterns) if count(allowed_patterns) > 0

patterns_text := "none: the namespace names no secret patterns (annotation runwarden.dev/secret-patterns, or secretRefs.allowedPatterns)" if count(allowed_patterns) == 0

address_allowed(address) if {
	some p in allowed_patterns
	glob.match(p, ["/", ":"], address)
}

# A pattern that does not start with a store can match no address: a
# pattern written for names alone ("team-a/*") says so. "**" is every
# address, said outright.
violations contains violation("secret-ref-pattern", "", "metadata.annotations", sprintf(
	"secret pattern %q of namespace %s names no store: write it as vault:<namespace>:<path>, azure:<key-vault>:<name>, gcp:<project>:<secret> or ssm:<name> (docs/secrets.md)",
	[p, input.namespace.name],
)) if {
	is_runner
	count(valid_refs) > 0
	some p in allowed_patterns
	not pattern_scoped(p)
}

pattern_scoped(p) if regex.match(`^(\*\*$|(ssm|vault|azure|gcp|\*):)`, p)

# A GCP reference without a project, where the configuration names none,
# has no address to check.
violations contains violation("secret-ref-gcp-project", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: %s names no project and the platform configuration sets none (secretStores.gcp.project); write ${gcp:projects/<project>/secrets/<secret>}",
	[ref.container, ref.env, ref.raw],
)) if {
	is_runner
	some ref in valid_refs
	ref.store == "gcp"
	ref.store in allowed_stores
	gcp_project(ref) == ""
}

# Vault: a reference reads a key-value secret under a mount the platform
# names (secretStores.vault.kvMounts, default ["secret"]), or a read of
# another secrets engine where the platform names that mount
# (secretStores.vault.engineMounts). Vault's own paths (sys/, auth/,
# identity/, cubbyhole/) are never secrets of the platform's choosing: a
# reference to them would read the resolver's own token or identity.
vault_reserved_mounts := {"sys", "auth", "identity", "cubbyhole"}

vault_kv_mounts := {trim(m, "/") | some m in object.get(cfg, ["secretStores", "vault", "kvMounts"], ["secret"])}

vault_engine_mounts := {trim(m, "/") | some m in object.get(cfg, ["secretStores", "vault", "engineMounts"], [])}

vault_mounts := (vault_kv_mounts | vault_engine_mounts) - vault_reserved_mounts

vault_under_mount(name) if {
	some m in vault_mounts
	startswith(name, concat("", [m, "/"]))
}

violations contains violation("secret-ref-vault-mount", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: %s reads Vault's own %s/ path, not a stored secret; only key-value mounts the platform names may be read (%s)",
	[ref.container, ref.env, ref.raw, split(ref.name, "/")[0], vault_mounts_text],
)) if {
	is_runner
	some ref in valid_refs
	ref.store == "vault"
	split(ref.name, "/")[0] in vault_reserved_mounts
}

violations contains violation("secret-ref-vault-mount", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: %s is under no Vault mount the platform names (%s; secretStores.vault.kvMounts or engineMounts)",
	[ref.container, ref.env, ref.raw, vault_mounts_text],
)) if {
	is_runner
	some ref in valid_refs
	ref.store == "vault"
	not split(ref.name, "/")[0] in vault_reserved_mounts
	not vault_under_mount(ref.name)
}

vault_mounts_text := concat(", ", sort([concat("", [m, "/"]) | some m in vault_mounts])) if count(vault_mounts) > 0

vault_mounts_text := "none" if count(vault_mounts) == 0

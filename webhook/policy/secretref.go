package policy

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/internal/contract"
)

// The forms of a secret reference, with what each part may hold.
var (
	refStart   = regexp.MustCompile(`\$\{(` + strings.Join(contract.SecretRefStores, "|") + `):`)
	ssmID      = regexp.MustCompile(`^[A-Za-z0-9/_+=.@:-]+$`)
	gcpID      = regexp.MustCompile(`^[A-Za-z0-9/_.-]{1,255}$`)
	azureName  = regexp.MustCompile(`^[A-Za-z0-9-]{1,127}$`)
	azureVault = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]{1,22}[A-Za-z0-9]$`)
	vaultPath  = regexp.MustCompile(`^[A-Za-z0-9/_-]+(/[A-Za-z0-9/_.-]+)*$`)
	vaultKey   = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	vaultNS    = regexp.MustCompile(`^[A-Za-z0-9/_-]+$`)
)

// refForms says, per store, the form a reference must have.
var refForms = map[string]string{
	"ssm":   "${ssm:<secret-id>} or ${ssm:<secret-id>#<json-key>}",
	"gcp":   "${gcp:<secret-id>}",
	"azure": "${azure:<secret-name>@<vault-name>}",
	"vault": "${vault:<secret-id>.<key>@<namespace>}",
}

// ParseSecretRef reads every secret reference in one env value. A value may
// hold several references and other text; only "${ssm:", "${gcp:",
// "${azure:" and "${vault:" start a reference.
func ParseSecretRef(container, env, value string) []SecretRef {
	var refs []SecretRef
	for _, m := range refStart.FindAllStringSubmatchIndex(value, -1) {
		store := value[m[2]:m[3]]
		bodyStart := m[1]
		end := strings.IndexByte(value[bodyStart:], '}')
		ref := SecretRef{Container: container, Env: env, Store: store}
		if end < 0 {
			ref.Raw = value[m[0]:]
			ref.Error = fmt.Sprintf("malformed secret reference %s: no closing brace; expected %s", ref.Raw, refForms[store])
			refs = append(refs, ref)
			continue
		}
		body := value[bodyStart : bodyStart+end]
		ref.Raw = value[m[0] : bodyStart+end+1]
		if err := ref.parseBody(body); err != "" {
			ref.Error = fmt.Sprintf("malformed secret reference %s: %s; expected %s", ref.Raw, err, refForms[store])
		}
		refs = append(refs, ref)
	}
	return refs
}

func (r *SecretRef) parseBody(body string) string {
	switch r.Store {
	case "ssm":
		// A "#<key>" names a key of a JSON value (a Secrets Manager secret's).
		if id, key, ok := strings.Cut(body, "#"); ok {
			if !vaultKey.MatchString(key) {
				return "invalid JSON key"
			}
			body, r.Key = id, key
		}
		if !ssmID.MatchString(body) {
			return "invalid secret id"
		}
		// A parameter name is a path from the root: its leading "/" is
		// the only empty segment it may have.
		if p := pathProblem(strings.TrimPrefix(body, "/")); p != "" {
			return "invalid secret id: " + p
		}
		r.Name = body
	case "gcp":
		if !gcpID.MatchString(body) {
			return "invalid secret id"
		}
		if p := pathProblem(body); p != "" {
			return "invalid secret id: " + p
		}
		// A name with a project is the whole resource name, whose project
		// the policies check; anything else is a secret of the configured
		// project, and has no "/".
		if seg := strings.Split(body, "/"); seg[0] == "projects" {
			if (len(seg) != 4 && len(seg) != 6) || seg[2] != "secrets" || (len(seg) == 6 && seg[4] != "versions") {
				return "invalid secret id: a name with a project is projects/<project>/secrets/<secret>[/versions/<version>]"
			}
		} else if len(seg) != 1 {
			return "invalid secret id: a secret of the configured project has no /"
		}
		r.Name = body
	case "azure":
		name, vault, ok := strings.Cut(body, "@")
		if !ok {
			return "no @<vault-name>"
		}
		if !azureName.MatchString(name) {
			return "invalid secret name"
		}
		if !azureVault.MatchString(vault) {
			return "invalid vault name"
		}
		r.Name, r.Vault = name, vault
	case "vault":
		at := strings.LastIndexByte(body, '@')
		if at < 0 {
			return "no @<namespace>"
		}
		pathKey, ns := body[:at], body[at+1:]
		dot := strings.LastIndexByte(pathKey, '.')
		if dot < 0 {
			return "no .<key>"
		}
		path, key := pathKey[:dot], pathKey[dot+1:]
		if !vaultPath.MatchString(path) {
			return "invalid secret id"
		}
		if p := pathProblem(path); p != "" {
			return "invalid secret id: " + p
		}
		if !vaultKey.MatchString(key) {
			return "invalid key"
		}
		if !vaultNS.MatchString(ns) {
			return "invalid namespace"
		}
		if p := pathProblem(ns); p != "" {
			return "invalid namespace: " + p
		}
		r.Name, r.Key, r.Vault = path, key, ns
	}
	return ""
}

// pathProblem says what is wrong with a secret's path, or "": a "." or ".."
// segment, or an empty one ("a//b", a leading or trailing "/"). Policies
// match names against glob patterns such as "team-a/**", which see
// "team-a/../team-b/db" as under team-a while the store resolves it
// elsewhere, or not at all; such a name is refused before any policy sees it.
func pathProblem(name string) string {
	for seg := range strings.SplitSeq(name, "/") {
		switch seg {
		case "":
			return "empty path segment (a leading, trailing or doubled /)"
		case ".", "..":
			return fmt.Sprintf("path segment %q", seg)
		}
	}
	return ""
}

// PodSecretRefs finds the secret references in the literal env values of
// every container of the pod.
func PodSecretRefs(pod *corev1.Pod) []SecretRef {
	var refs []SecretRef
	scan := func(cs []corev1.Container) {
		for _, c := range cs {
			for _, e := range c.Env {
				if strings.Contains(e.Value, "${") {
					refs = append(refs, ParseSecretRef(c.Name, e.Name, e.Value)...)
				}
			}
		}
	}
	scan(pod.Spec.InitContainers)
	scan(pod.Spec.Containers)
	return refs
}

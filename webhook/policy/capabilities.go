package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The policies decide on a pod from their input alone. A built-in that
// reaches the network or the host would let a policy (or, through it, a pod's
// fields) send the webhook's requests elsewhere, read its environment or
// files, or wait on a slow server while runner pods queue: the policies are
// compiled without them, and a set that calls one is refused at load, with
// the call's file and line.

// refusedBuiltin tells whether the policies may not call the built-in name,
// and why.
func refusedBuiltin(name string) (why string, refused bool) {
	switch name {
	case "http.send":
		return "it sends requests over the network", true
	case "net.lookup_ip_addr":
		return "it resolves names over the network", true
	case "opa.runtime":
		return "it reads the webhook's environment and configuration", true
	case "json.match_schema", "json.verify_schema":
		// A schema's $ref may name a file:// URL, which OPA reads from the
		// host's file system whatever the network capabilities say.
		return "a schema's $ref reads files of the webhook's host", true
	}
	return "", false
}

// RefusedBuiltins lists the built-ins the policies may not call, sorted.
func RefusedBuiltins() []string {
	var names []string
	for _, b := range ast.CapabilitiesForThisVersion().Builtins {
		if _, refused := refusedBuiltin(b.Name); refused {
			names = append(names, b.Name)
		}
	}
	slices.Sort(names)
	return names
}

// Capabilities are the OPA capabilities the policies are compiled and
// evaluated with: this OPA version's, without the built-ins refusedBuiltin
// names, and with no host allowed for network access (AllowNet empty, not
// nil, which would allow every host).
func Capabilities() *ast.Capabilities {
	c := ast.CapabilitiesForThisVersion()
	c.Builtins = slices.DeleteFunc(c.Builtins, func(b *ast.Builtin) bool {
		_, refused := refusedBuiltin(b.Name)
		return refused
	})
	c.AllowNet = []string{}
	return c
}

// explainRefused rewrites the compiler's "undefined function" errors for a
// refused built-in into why it is refused; the error keeps its location,
// so the message names the file and line of the call.
func explainRefused(errs ast.Errors) ast.Errors {
	out := make(ast.Errors, 0, len(errs))
	for _, e := range errs {
		name, isUndefined := strings.CutPrefix(e.Message, "undefined function ")
		if why, refused := refusedBuiltin(name); isUndefined && e.Code == ast.TypeErr && refused {
			c := *e
			c.Message = fmt.Sprintf("%s is not allowed in runwarden policies: %s (see docs/policy.md)", name, why)
			e = &c
		}
		out = append(out, e)
	}
	return out
}

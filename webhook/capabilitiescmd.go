package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/runwarden/runwarden/webhook/policy"
)

// policyCapabilities prints the OPA capabilities the webhook compiles the
// policies with, for `opa check --capabilities` (make verify checks the
// shipped policies with it; platform teams can check their own in CI).
func policyCapabilities(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if isHelp(args[0]) {
			fmt.Fprintln(stdout, "Usage: runwarden-webhook policy capabilities\n  print the OPA capabilities (JSON) the policies are compiled with: this OPA version's, without the built-ins that reach the network or the host")
			return 0
		}
		fmt.Fprintf(stderr, "runwarden-webhook policy capabilities: unexpected arguments %q\n", args)
		return 2
	}
	b, err := capabilitiesJSON()
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy capabilities: %v\n", err)
		return 1
	}
	_, _ = stdout.Write(b)
	return 0
}

// capabilitiesJSON is policy.Capabilities as JSON, with allow_net: [] (no
// host) written out: OPA's type leaves an empty list out, and a file without
// allow_net allows every host.
func capabilitiesJSON() ([]byte, error) {
	b, err := json.Marshal(policy.Capabilities())
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["allow_net"] = json.RawMessage("[]")
	out, err := json.MarshalIndent(m, "", "  ")
	return append(out, '\n'), err
}

// Package policies embeds runwarden's shipped Rego policies and their tests,
// the defaults the webhook evaluates when no policy folder is mounted.
// The embed directive cannot reach a parent folder, so this file lives beside them.
package policies

import "embed"

// FS holds every *.rego file of this folder, tests included.
//
//go:embed *.rego
var FS embed.FS

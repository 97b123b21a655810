//go:build tools

// Package vault only records the command this wrapper module builds.
package vault

import _ "github.com/hashicorp/vault"

//go:build tools

// Package vault only records the commands this wrapper module builds: Vault,
// and its Kubernetes auth method as an external plugin (Vault's minimal
// build has no such method built in).
package vault

import (
	_ "github.com/hashicorp/vault"
	_ "github.com/hashicorp/vault-plugin-auth-kubernetes/cmd/vault-plugin-auth-kubernetes"
)

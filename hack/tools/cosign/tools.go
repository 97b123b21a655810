//go:build tools

// Package cosign only records the command this wrapper module builds.
package cosign

import (
	_ "github.com/sigstore/cosign/v2/cmd/cosign"
)

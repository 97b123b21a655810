//go:build tools

// Package opentofu only records the command this wrapper module builds.
package opentofu

import _ "github.com/opentofu/opentofu/cmd/tofu"

//go:build tools

// Package gitea only records the command this wrapper module builds.
package gitea

import _ "code.gitea.io/gitea"

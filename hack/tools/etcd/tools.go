//go:build tools

// Package etcd only records the command this wrapper module builds.
package etcd

import _ "go.etcd.io/etcd/server/v3"

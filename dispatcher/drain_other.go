//go:build !linux

package main

import (
	"io"
	"time"
)

// drainOut does nothing where runner containers do not run.
func drainOut(io.Writer, time.Duration) {}

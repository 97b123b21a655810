// Package version holds the build version of the runwarden binaries, stamped
// at link time by the Makefile.
package version

import "runtime/debug"

// Version is the release version, set with
// -ldflags "-X github.com/runwarden/runwarden/internal/version.Version=v0.1.0".
// When it is not set, String falls back to the module version Go recorded in
// the binary, and then to "devel".
var Version = ""

// String returns the version to print for --version.
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

//go:build e2e

// Package e2e holds runwarden's end-to-end suites. They run against a real
// kube-apiserver chosen by RUNWARDEN_E2E_CLUSTER (see package harness):
//
//	go test -tags e2e ./e2e/...
package e2e

import (
	"fmt"
	"os"
	"testing"

	"sigs.k8s.io/e2e-framework/pkg/env"

	"github.com/runwarden/runwarden/e2e/harness"
)

// testenv is the suite's environment. e2e-framework's TestMain pattern needs
// it at package level: TestMain sets it once and every test reads it.
var testenv env.Environment

func TestMain(m *testing.M) {
	c, err := harness.ConfigFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	fmt.Fprintf(os.Stderr, "e2e: cluster %q (%s)\n", c.Name, c.Kind)
	testenv = harness.NewEnvironment(c)
	os.Exit(testenv.Run(m))
}

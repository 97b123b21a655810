//go:build e2e

// Package e2e holds runwarden's end-to-end suites. They run against a real
// kube-apiserver chosen by RUNWARDEN_E2E_CLUSTER (see package harness):
//
//	go test -tags e2e ./e2e/...
package e2e

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/e2e-framework/pkg/env"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/e2e/harness"
)

// testenv is the suite's environment, suite its configuration and built
// the programs it builds. e2e-framework's TestMain pattern needs them at
// package level: TestMain sets them once and every test reads them.
var (
	testenv env.Environment
	suite   harness.Config
	built   *binaries
)

func TestMain(m *testing.M) {
	c, err := harness.ConfigFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	if c.Kind == harness.ClusterExisting {
		fmt.Fprintf(os.Stderr, "e2e: existing cluster of %s\n", c.Kubeconfig)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: %s cluster %q\n", c.Kind, c.Name)
	}
	suite = c
	// Every client of the suite, e2e-framework's included, uses client-go's
	// one scheme. Tests run side by side (docs/e2e.md), so it gets the
	// suite's types here, once, before any test reads it.
	for _, add := range []func(*runtime.Scheme) error{apiextensionsv1.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme.Scheme); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: registering the suite's API types:", err)
			os.Exit(2)
		}
	}
	// An interrupted run (Ctrl-C, a CI job stopped) never reaches Finish:
	// stop the local cluster it started before going.
	// The go command ends at once on SIGTERM, closing the pipe this
	// process writes its output to: writing must then fail, not end the
	// process before it has stopped the cluster.
	signal.Ignore(syscall.SIGPIPE)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		signal.Stop(sigs) // a second signal ends the process at once
		fmt.Fprintf(os.Stderr, "e2e: %v: stopping the cluster\n", s)
		if err := harness.StopLocal(c); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
		os.Exit(130)
	}()
	if built, err = newBinaries(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	testenv = harness.NewEnvironment(c)
	code := testenv.Run(m)
	if err := built.remove(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: removing the suite's binaries:", err)
	}
	if err := harness.TeardownError(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stopping the cluster failed:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

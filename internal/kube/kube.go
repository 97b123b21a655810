// Package kube finds the cluster the runwarden binaries talk to.
package kube

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
)

// RestConfig returns the configuration of the cluster: from the kubeconfig
// file when one is named, else from $KUBECONFIG when set, else in-cluster,
// else ~/.kube/config (controller-runtime's order).
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("reading kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("finding the cluster: %w", err)
	}
	return cfg, nil
}

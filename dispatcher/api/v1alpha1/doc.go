// Package v1alpha1 is the runwarden.dev/v1alpha1 API: the RunnerTask, a
// task submitted to the dispatcher as a Kubernetes object.
//
// +kubebuilder:object:generate=true
// +groupName=runwarden.dev
package v1alpha1

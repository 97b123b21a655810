package orchestrator

import "sigs.k8s.io/controller-runtime/pkg/event"

// Enqueued is what the source asks its Job controller to reconcile (the
// controller's channel source), for tests of package orchestrator_test that
// run no controller: the source sends a Job's key there once it has made the
// Job, so such a test waits on it rather than on time.
func (s *Source) Enqueued() <-chan event.GenericEvent { return s.trigger }

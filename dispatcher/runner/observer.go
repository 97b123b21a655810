package runner

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// NewObserver is the job.Observer a source reads its Jobs' outcomes with:
// pods from cache (the label-filtered cache is enough), Warning events
// from api (they are not in that cache), and, with Kueue, the Workloads
// of Jobs that wait from api too (they are never cached); without Kueue no
// Workload is read.
func NewObserver(o Options, cache, api client.Reader, kueue bool) job.Observer {
	obs := job.Observer{Client: cache, Events: api, UnschedulableTimeout: o.UnschedulableTimeout, Now: o.Clock.Now}
	if kueue {
		obs.Workloads = api
	}
	return obs
}

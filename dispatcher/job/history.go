package job

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/internal/contract"
)

// History says how many finished Jobs of one dispatcher to keep in a
// namespace.
type History struct {
	Namespace    string
	DispatcherID string
	// Succeeded and Failed are the limits per kind of outcome.
	Succeeded, Failed int
	// Marked names a Job just marked reported, whose mark the cache may not
	// show yet; it counts as reported.
	Marked string
	// Now is the time AnnotationKeepUntil is compared with. Default:
	// time.Now.
	Now time.Time
}

// KeepUntil is a Job's AnnotationKeepUntil, zero without one (or with one
// that does not parse).
func KeepUntil(j *batchv1.Job) time.Time {
	t, _ := time.Parse(time.RFC3339, j.Annotations[AnnotationKeepUntil])
	return t
}

// PruneHistory deletes the oldest reported Jobs beyond the history limits,
// but none before its AnnotationKeepUntil: such a Job still counts, and goes
// in a prune after that time. next is the earliest time a Job it left so
// becomes free to go (zero if none): when to prune again.
func PruneHistory(ctx context.Context, c client.Client, h History) (next time.Time, err error) {
	if h.Now.IsZero() {
		h.Now = time.Now()
	}
	var jobs batchv1.JobList
	// Read-only until a Job is deleted: the cache's objects are not copied.
	if err := c.List(ctx, &jobs, client.InNamespace(h.Namespace), client.MatchingLabels{contract.LabelDispatcher: h.DispatcherID}, client.UnsafeDisableDeepCopy); err != nil {
		return time.Time{}, fmt.Errorf("listing jobs: %w", err)
	}
	var succeeded, failed []*batchv1.Job
	for i := range jobs.Items {
		j := &jobs.Items[i]
		// Only Jobs whose outcome the source holds may go.
		reported := j.Annotations[AnnotationReported] != "" || j.Name == h.Marked
		if j.DeletionTimestamp != nil || !Finished(j) || !reported {
			continue
		}
		if Succeeded(j) {
			succeeded = append(succeeded, j)
		} else {
			failed = append(failed, j)
		}
	}
	for _, set := range []struct {
		jobs  []*batchv1.Job
		limit int
	}{{succeeded, h.Succeeded}, {failed, h.Failed}} {
		if len(set.jobs) <= set.limit {
			continue
		}
		// Oldest first, by name within a second (creation times have
		// one-second precision): prunes running side by side, each from its
		// own view of the cache, must agree on which Jobs are the oldest, or
		// together they delete more than the limit allows.
		slices.SortFunc(set.jobs, func(a, b *batchv1.Job) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		for _, j := range set.jobs[:len(set.jobs)-set.limit] {
			if keep := KeepUntil(j); h.Now.Before(keep) {
				if next.IsZero() || keep.Before(next) {
					next = keep
				}
				continue
			}
			if err := c.Delete(ctx, j.DeepCopy(), client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return next, fmt.Errorf("deleting old job %s: %w", j.Name, err)
			}
		}
	}
	return next, nil
}

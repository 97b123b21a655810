// Package orchestrator is the dispatcher's `orchestrator` task source: it
// long-polls a remote orchestrator over HTTPS for task leases, runs each
// task as the one Job package job builds, renews the lease while the task
// runs, and reports events and logs back with idempotency keys. The Job is
// the durable record: the lease, and whether the final status was
// acknowledged, live in its annotations, so a restarted dispatcher carries
// on where the last one stopped. The protocol is docs/protocol.md.
package orchestrator

import (
	"encoding/json"
	"time"
)

// Version is the protocol version this package speaks, sent in the
// Runwarden-Protocol header of every request.
const Version = "1"

// HeaderProtocol is the header carrying the protocol version.
const HeaderProtocol = "Runwarden-Protocol"

// Paths of the protocol's endpoints, relative to the orchestrator's base URL.
const (
	PathPoll  = "/v1/leases:poll"
	PathToken = "/v1/auth/token"
)

// PathRenew is the renewal endpoint of a lease.
func PathRenew(leaseID string) string { return "/v1/leases/" + leaseID + ":renew" }

// PathRelease is the endpoint that hands a lease back unused.
func PathRelease(leaseID string) string { return "/v1/leases/" + leaseID + ":release" }

// PathEvents is the event endpoint of a task.
func PathEvents(taskID string) string { return "/v1/tasks/" + taskID + "/events" }

// PathLogs is the log endpoint of a task.
func PathLogs(taskID string) string { return "/v1/tasks/" + taskID + "/logs" }

// Capacity is what a dispatcher can still take.
type Capacity struct {
	// Free is how many new leases it takes now, at most Max.
	Free int `json:"free"`
	// Max is the most leases it holds at once (with Kueue, queued tasks
	// included): re-issued and new leases of one poll are at most Max.
	Max int `json:"max"`
}

// PollRequest asks for at most Capacity.Free leases.
type PollRequest struct {
	DispatcherID string   `json:"dispatcherId"`
	Capacity     Capacity `json:"capacity"`
	// Running lists the tasks the dispatcher holds a Job for whose final
	// status is not acknowledged yet. An orchestrator re-issues an expired
	// lease of one of them (new epoch) to this dispatcher if it held the
	// task's last lease, and to no other; re-issued leases count against
	// Capacity.Max, not Capacity.Free (their Jobs already hold a slot).
	Running     []string `json:"running"`
	WaitSeconds int      `json:"waitSeconds"`
}

// PollResponse carries the leases handed out (200). No task within
// WaitSeconds is 204 with no body.
type PollResponse struct {
	Leases []Lease `json:"leases"`
}

// Lease is a task handed to one dispatcher until ExpiresAt, renewable.
type Lease struct {
	LeaseID string `json:"leaseId"`
	// Epoch grows each time the task is handed out again; events with an
	// older epoch are refused (409 stale-lease).
	Epoch        int64     `json:"epoch"`
	LeaseSeconds int       `json:"leaseSeconds"`
	ExpiresAt    time.Time `json:"expiresAt"`
	Task         Task      `json:"task"`
}

// Task is one unit of work as the orchestrator describes it.
type Task struct {
	ID string `json:"id"`
	// Namespace of the Job; default: the dispatcher's namespace.
	Namespace string   `json:"namespace,omitempty"`
	Image     string   `json:"image,omitempty"`
	Command   []string `json:"command,omitempty"`
	Args      []string `json:"args,omitempty"`
	Env       []EnvVar `json:"env,omitempty"`
	// SecretEnv values never appear in the Job: they go into a per-task
	// Secret the Job owns.
	SecretEnv             map[string]string `json:"secretEnv,omitempty"`
	RepoURL               string            `json:"repoURL,omitempty"`
	ActiveDeadlineSeconds *int64            `json:"activeDeadlineSeconds,omitempty"`
	// Resources of the runner container; default: the pod template's.
	Resources *Resources `json:"resources,omitempty"`
	// Queue is the Kueue LocalQueue the task waits in, when the dispatcher
	// queues through Kueue (protocol 1.1). Default: the dispatcher's.
	Queue string `json:"queue,omitempty"`
	// PriorityClass is the task's Kueue WorkloadPriorityClass (protocol
	// 1.1). Default: the dispatcher's.
	PriorityClass string `json:"priorityClass,omitempty"`
}

// EnvVar is a plain variable; its value may be a secret reference such as
// ${vault:secret/db.password@team-a}, passed through untouched.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	// ValueFrom is not part of the protocol: it is read only so that a
	// task sending one (say, a Kubernetes secretKeyRef) is refused,
	// rather than run without the variable.
	ValueFrom json.RawMessage `json:"valueFrom,omitempty"`
}

// Resources are the runner container's compute resources, in the shape
// of a Kubernetes container's resources (ResourceRequirements) but the
// protocol's own type: a change of Kubernetes' type cannot change the
// protocol. The dispatcher converts them to Kubernetes' when it builds the
// task's Job (kubeResources); a quantity Kubernetes cannot read fails that
// task alone, with reason Refused.
type Resources struct {
	// Limits and Requests map a resource name (cpu, memory,
	// nvidia.com/gpu, ...) to a quantity.
	Limits   map[string]Quantity `json:"limits,omitempty"`
	Requests map[string]Quantity `json:"requests,omitempty"`
	// Claims name resource claims of the runner pod (dynamic resource
	// allocation: the platform's pod template declares them) that the
	// runner container uses.
	Claims []ResourceClaim `json:"claims,omitempty"`
}

// ResourceClaim names a resource claim of the runner pod and, optionally,
// one request in it.
type ResourceClaim struct {
	Name    string `json:"name"`
	Request string `json:"request,omitempty"`
}

// Quantity is a Kubernetes resource quantity, such as 500m, 2 or 1Gi. On
// the wire it is a JSON string; as Kubernetes does, a JSON number is read
// as its decimal text and null as 0. It is checked when the task's Job is
// built, not when a poll's answer is read, so that a task with a bad
// quantity fails alone rather than making the whole answer unreadable.
type Quantity string

// UnmarshalJSON reads a quantity as Kubernetes reads one, and keeps any
// other JSON value's text for the Job's build to refuse.
func (q *Quantity) UnmarshalJSON(b []byte) error {
	var s string
	switch {
	case string(b) == "null":
		*q = "0"
	case json.Unmarshal(b, &s) == nil:
		*q = Quantity(s)
	default:
		*q = Quantity(b)
	}
	return nil
}

// RenewRequest extends a lease.
type RenewRequest struct {
	DispatcherID string `json:"dispatcherId"`
	Epoch        int64  `json:"epoch"`
}

// ReleaseRequest hands a lease back: the dispatcher will not run its task,
// and the orchestrator may hand it out again at once.
type ReleaseRequest struct {
	DispatcherID string `json:"dispatcherId"`
	Epoch        int64  `json:"epoch"`
}

// RenewResponse is the new expiry, and a cancellation when asked for.
type RenewResponse struct {
	ExpiresAt    time.Time `json:"expiresAt"`
	Cancel       bool      `json:"cancel"`
	CancelReason string    `json:"cancelReason,omitempty"`
}

// EventType is what happened to a task.
type EventType string

// The event types. Succeeded, Failed and Cancelled are final: a task has
// exactly one, and it ends the lease.
const (
	EventJobCreated EventType = "job-created"
	EventRunning    EventType = "running"
	// EventQueued: the task's Job waits for Kueue to admit it; the message
	// names the LocalQueue and why it waits (protocol 1.1).
	EventQueued    EventType = "queued"
	EventSucceeded EventType = "succeeded"
	EventFailed    EventType = "failed"
	EventCancelled EventType = "cancelled"
)

// Final tells whether an event type ends the task.
func (t EventType) Final() bool {
	return t == EventSucceeded || t == EventFailed || t == EventCancelled
}

// Event is a status report. The orchestrator stores the first report with
// a given IdempotencyKey and answers the same for repeats.
type Event struct {
	// IdempotencyKey is "<task ID>/<type>" for job-created and running, and
	// "<task ID>/final" for the final event, whatever the epoch: a task
	// re-leased after a restart does not report its outcome twice.
	IdempotencyKey string    `json:"idempotencyKey"`
	Epoch          int64     `json:"epoch"`
	Type           EventType `json:"type"`
	JobName        string    `json:"jobName,omitempty"`
	// Reason is a bounded word (Completed, NonZeroExit, DeadlineExceeded,
	// Unschedulable, ...); Message has the detail and the pod's Warning
	// events.
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	ExitCode *int32 `json:"exitCode,omitempty"`
	// Record is what the task ran, on final events of tasks that had a
	// Job (protocol 1.1).
	Record *Record   `json:"record,omitempty"`
	Time   time.Time `json:"time"`
}

// Record is what a task ran, names and digests only (protocol 1.1): the
// protocol's own shape of the dispatcher's task record, so that a change
// of the record inside the dispatcher cannot change the protocol.
type Record struct {
	// SpecDigest is "sha256:<hex>" of the runner pod's spec as admitted.
	SpecDigest   string `json:"specDigest,omitempty"`
	PolicyDigest string `json:"policyDigest,omitempty"`
	// TemplateDigest is "sha256:<hex>" of the platform's pod template.
	TemplateDigest string        `json:"templateDigest,omitempty"`
	Mutations      []string      `json:"mutations,omitempty"`
	Warnings       []string      `json:"warnings,omitempty"`
	Images         []ImageRecord `json:"images,omitempty"`
	Node           string        `json:"node,omitempty"`
	Pod            string        `json:"pod,omitempty"`
	// StartedAt and FinishedAt are in whole seconds.
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
}

// ImageRecord is one container's image and the image ID the node ran.
type ImageRecord struct {
	Container string `json:"container"`
	Image     string `json:"image,omitempty"`
	ImageID   string `json:"imageID,omitempty"`
}

// LogChunk is a piece of the runner container's log. Offset is its byte
// position in the log; the orchestrator keeps the log as one byte string
// and stores only the bytes past its end, so a chunk sent again (with the
// same or different boundaries) is stored once. A chunk starting past the
// end is refused (409 log-gap).
type LogChunk struct {
	IdempotencyKey string `json:"idempotencyKey"`
	Epoch          int64  `json:"epoch"`
	Offset         int64  `json:"offset"`
	// Data is at most MaxLogChunk bytes (base64 in JSON).
	Data  []byte `json:"data"`
	Final bool   `json:"final"`
}

// MaxLogChunk is the largest LogChunk.Data.
const MaxLogChunk = 64 << 10

// TokenRequest exchanges a projected service-account token for an
// orchestrator token.
type TokenRequest struct {
	Token string `json:"token"`
}

// TokenResponse is an orchestrator token and its lifetime.
type TokenResponse struct {
	AccessToken string `json:"access_token"`
	TokenType   string `json:"token_type"`
	ExpiresIn   int    `json:"expires_in"`
}

// ErrorBody is the body of every error response.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes.
const (
	CodeStaleLease   = "stale-lease"
	CodeGone         = "lease-gone"
	CodeLogGap       = "log-gap"
	CodeBadRequest   = "bad-request"
	CodeUnauthorized = "unauthorized"
	CodeVersion      = "unsupported-version"
	// CodeNotLeaseHolder (403) refuses a renewal, release, event or log
	// chunk from a dispatcher that does not hold the lease it names (the
	// lease of the request's epoch): the lease is not the caller's.
	CodeNotLeaseHolder = "not-lease-holder"
	// CodeForbidden (403) refuses a poll whose dispatcherId is not the
	// authenticated dispatcher's.
	CodeForbidden = "forbidden"
)

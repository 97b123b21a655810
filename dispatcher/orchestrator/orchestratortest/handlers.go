package orchestratortest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
)

// codeNotFound is the error code of a 404: an unknown task or path.
const codeNotFound = "not-found"

// maxBody bounds a request body; a full log chunk is about 88 KiB of JSON.
const maxBody = 1 << 20

// expiryMargin is added to a wait for a lease's expiry so that the lease
// has expired when the wait ends.
const expiryMargin = 5 * time.Millisecond

// poll is the long-poll endpoint. An authenticated dispatcher polls for
// itself alone: its dispatcherId is what it is re-issued leases for.
func (s *Server) poll(w http.ResponseWriter, r *http.Request, caller string) {
	var req orchestrator.PollRequest
	if !decode(w, r, &req) {
		return
	}
	switch {
	case req.DispatcherID == "":
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest, "dispatcherId is empty")
		return
	case req.Capacity.Free < 0 || req.Capacity.Max < 0:
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest, "negative capacity")
		return
	case req.Capacity.Free > req.Capacity.Max:
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest,
			fmt.Sprintf("capacity.free %d is more than capacity.max %d", req.Capacity.Free, req.Capacity.Max))
		return
	case req.WaitSeconds < 0:
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest, "negative waitSeconds")
		return
	case caller != "" && req.DispatcherID != caller:
		s.mu.Lock()
		s.stats.NotLeaseHolder++
		s.mu.Unlock()
		writeError(w, http.StatusForbidden, orchestrator.CodeForbidden,
			fmt.Sprintf("dispatcherId %q is not the authenticated dispatcher %q", req.DispatcherID, caller))
		return
	}
	deadline := s.clock.Now().Add(min(time.Duration(req.WaitSeconds)*time.Second, s.opts.MaxWait))
	for {
		s.mu.Lock()
		now := s.clock.Now()
		s.expireLocked(now)
		leases, rec := s.leasesLocked(&req, now)
		next := s.nextExpiryLocked()
		wake := s.wake
		if len(leases) > 0 || !now.Before(deadline) {
			s.polls = append(s.polls, rec)
		}
		s.mu.Unlock()

		if len(leases) > 0 {
			writeJSON(w, http.StatusOK, orchestrator.PollResponse{Leases: leases})
			return
		}
		wait := deadline.Sub(s.clock.Now())
		if wait <= 0 {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if !next.IsZero() {
			wait = min(wait, next.Sub(s.clock.Now())+expiryMargin)
		}
		timer := s.clock.NewTimer(wait)
		s.mu.Lock()
		s.stats.PollsWaiting++
		s.holdingLocked()
		s.mu.Unlock()
		select {
		case <-wake:
		case <-timer.C():
		case <-s.closed:
			s.pollDone(timer)
			w.WriteHeader(http.StatusNoContent)
			return
		case <-r.Context().Done():
			s.pollDone(timer)
			return
		}
		s.pollDone(timer)
	}
}

// pollDone ends one wait of a held poll.
func (s *Server) pollDone(timer interface{ Stop() bool }) {
	timer.Stop()
	s.mu.Lock()
	s.stats.PollsWaiting--
	s.holdingLocked()
	s.mu.Unlock()
}

// leasesLocked hands out what a poll gets now: duplicates owed to the
// dispatcher, expired leases of the tasks it runs and held last, then new
// leases from the queue. Re-issued and new leases together are at most
// Capacity.Max, and new ones at most Capacity.Free.
func (s *Server) leasesLocked(req *orchestrator.PollRequest, now time.Time) ([]orchestrator.Lease, PollRecord) {
	rec := PollRecord{
		DispatcherID: req.DispatcherID,
		Capacity:     req.Capacity,
		Running:      req.Running,
		WaitSeconds:  req.WaitSeconds,
		Time:         now,
	}
	var out []orchestrator.Lease
	for _, d := range s.dups[req.DispatcherID] {
		if d.t.rec.Leased && d.t.lease.LeaseID == d.lease.LeaseID {
			out = append(out, d.lease)
			rec.Duplicates++
			s.stats.DuplicateLeases++
		}
	}
	delete(s.dups, req.DispatcherID)

	var issued []orchestrator.Lease
	for _, id := range req.Running {
		t, ok := s.tasks[id]
		if !ok || !t.rec.Queued || t.rec.Epoch == 0 || t.rec.Final != nil {
			continue
		}
		// Only the dispatcher that held the task's last lease gets it back
		// (its Job runs it): to another, listing it would hand it the task,
		// secretEnv included, outside its capacity. That one is told
		// nothing, and the task stays queued as it was.
		if last := t.rec.Leases[len(t.rec.Leases)-1]; last.DispatcherID != req.DispatcherID {
			s.stats.ReissueRefused++
			continue
		}
		if rec.Reissued >= req.Capacity.Max {
			s.stats.ReissueRefused++
			continue
		}
		issued = append(issued, s.issueLocked(t, req.DispatcherID, now, true))
		rec.Reissued++
	}
	for i := 0; i < len(s.queue) && rec.New < min(req.Capacity.Free, req.Capacity.Max-rec.Reissued)+s.faults.OverDeliver; {
		t := s.queue[i]
		if t.rec.Cancelled || t.rec.Final != nil {
			i++ // re-issued only for Running
			continue
		}
		issued = append(issued, s.issueLocked(t, req.DispatcherID, now, false))
		rec.New++
	}
	if rec.New > req.Capacity.Free || rec.New+rec.Reissued > req.Capacity.Max {
		s.stats.CapacityViolations++
	}

	for _, l := range issued {
		out = append(out, l)
		if !s.chance(s.faults.DuplicateLeaseRate) || !s.faults.appliesTo(EndpointPoll) {
			continue
		}
		if s.faults.DuplicateNextPoll {
			s.dups[req.DispatcherID] = append(s.dups[req.DispatcherID], dup{t: s.byLease[l.LeaseID], lease: l})
			continue
		}
		out = append(out, l)
		rec.Duplicates++
		s.stats.DuplicateLeases++
	}
	rec.Running = slices.Clone(rec.Running)
	return out, rec
}

// renew is the lease renewal endpoint.
func (s *Server) renew(w http.ResponseWriter, r *http.Request, caller, leaseID string) {
	var req orchestrator.RenewRequest
	if !decode(w, r, &req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	s.expireLocked(now)
	t, ok := s.byLease[leaseID]
	switch {
	case !ok:
		writeError(w, http.StatusGone, orchestrator.CodeGone, "no lease "+leaseID)
		return
	case !t.rec.Leased || t.lease.LeaseID != leaseID:
		writeError(w, http.StatusGone, orchestrator.CodeGone, fmt.Sprintf("lease %s of task %s is gone", leaseID, t.rec.Task.ID))
		return
	case s.notHolderLocked(w, t, cmp.Or(caller, req.DispatcherID), t.lease.Epoch):
		return
	case s.notCallerLocked(w, t, caller, req.DispatcherID):
		return
	case req.Epoch != t.lease.Epoch:
		writeError(w, http.StatusConflict, orchestrator.CodeStaleLease, fmt.Sprintf("lease %s has epoch %d, not %d", leaseID, t.lease.Epoch, req.Epoch))
		return
	}
	t.lease.ExpiresAt = now.Add(s.leaseDuration())
	t.rec.ExpiresAt = t.lease.ExpiresAt
	t.rec.Renewals++
	writeJSON(w, http.StatusOK, orchestrator.RenewResponse{
		ExpiresAt:    t.lease.ExpiresAt,
		Cancel:       t.rec.Cancelled,
		CancelReason: t.rec.CancelReason,
	})
}

// releaseLease is the endpoint that hands a lease back: the task goes back to the
// queue at once.
func (s *Server) releaseLease(w http.ResponseWriter, r *http.Request, caller, leaseID string) {
	var req orchestrator.ReleaseRequest
	if !decode(w, r, &req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.clock.Now())
	t, ok := s.byLease[leaseID]
	switch {
	case !ok || !t.rec.Leased || t.lease.LeaseID != leaseID:
		writeError(w, http.StatusGone, orchestrator.CodeGone, "no live lease "+leaseID)
		return
	case s.notHolderLocked(w, t, cmp.Or(caller, req.DispatcherID), t.lease.Epoch):
		return
	case s.notCallerLocked(w, t, caller, req.DispatcherID):
		return
	case req.Epoch != t.lease.Epoch:
		writeError(w, http.StatusConflict, orchestrator.CodeStaleLease, fmt.Sprintf("lease %s has epoch %d, not %d", leaseID, t.lease.Epoch, req.Epoch))
		return
	}
	t.rec.Leased = false
	t.rec.Releases++
	s.enqueueLocked(t)
	w.WriteHeader(http.StatusNoContent)
}

// notHolderLocked answers 403 not-lease-holder to an authenticated caller
// that did not hold the task's lease of epoch, and tells whether it did. A
// lease is bound to the dispatcher that polled for it, not to whoever knows
// its ID or epoch.
func (s *Server) notHolderLocked(w http.ResponseWriter, t *task, caller string, epoch int64) bool {
	if caller == "" {
		return false
	}
	for _, l := range t.rec.Leases {
		if l.Epoch == epoch && l.DispatcherID == caller {
			return false
		}
	}
	s.stats.NotLeaseHolder++
	t.rec.NotHolder++
	writeError(w, http.StatusForbidden, orchestrator.CodeNotLeaseHolder,
		fmt.Sprintf("task %s: the lease of epoch %d is not held by dispatcher %s", t.rec.Task.ID, epoch, caller))
	return true
}

// notCallerLocked answers 403 not-lease-holder to a renewal or release
// whose dispatcherId is not the authenticated dispatcher (which holds the
// lease: notHolderLocked came first), and tells whether it did: a
// dispatcher speaks only in its own name.
func (s *Server) notCallerLocked(w http.ResponseWriter, t *task, caller, named string) bool {
	if caller == "" || named == caller {
		return false
	}
	s.stats.NotLeaseHolder++
	t.rec.NotHolder++
	writeError(w, http.StatusForbidden, orchestrator.CodeNotLeaseHolder,
		fmt.Sprintf("task %s: dispatcherId %q is not the authenticated dispatcher %q", t.rec.Task.ID, named, caller))
	return true
}

// checkEpochLocked answers an event or log request whose epoch is not the
// task's current one and tells whether it did.
func checkEpochLocked(w http.ResponseWriter, t *task, epoch int64) bool {
	switch {
	case epoch < 1 || epoch > t.rec.Epoch:
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest,
			fmt.Sprintf("task %s was never leased with epoch %d", t.rec.Task.ID, epoch))
		return true
	case epoch < t.rec.Epoch:
		t.rec.Stale++
		writeError(w, http.StatusConflict, orchestrator.CodeStaleLease,
			fmt.Sprintf("task %s is at epoch %d, not %d", t.rec.Task.ID, t.rec.Epoch, epoch))
		return true
	}
	return false
}

// events is the event endpoint of a task.
func (s *Server) events(w http.ResponseWriter, r *http.Request, caller, taskID string) {
	var ev orchestrator.Event
	if !decode(w, r, &ev) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.clock.Now())
	t, ok := s.tasks[taskID]
	if !ok {
		writeError(w, http.StatusNotFound, codeNotFound, "no task "+taskID)
		return
	}
	t.rec.EventPosts++
	if ev.Type.Final() {
		t.rec.FinalPosts++
	}
	switch ev.Type {
	case orchestrator.EventJobCreated, orchestrator.EventQueued, orchestrator.EventRunning,
		orchestrator.EventSucceeded, orchestrator.EventFailed, orchestrator.EventCancelled:
	default:
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest, fmt.Sprintf("unknown event type %q", ev.Type))
		return
	}
	if ev.IdempotencyKey == "" {
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest, "idempotencyKey is empty")
		return
	}
	// An event is the dispatcher's that held the lease of its epoch, a
	// repeat included: no other may store or confirm one.
	if ev.Epoch >= 1 && ev.Epoch <= t.rec.Epoch && s.notHolderLocked(w, t, caller, ev.Epoch) {
		return
	}
	// A repeat is answered as stored whatever its epoch: a dispatcher whose
	// Job records an older lease than the one the event was stored under (a
	// restart before a handed-back lease was written to the Job, or a task
	// the server ended itself under a lease whose answer was lost) learns
	// that the task is over instead of being refused for ever. An event not
	// stored yet is checked against the current epoch.
	if i, ok := t.keys[ev.IdempotencyKey]; ok && ev.Epoch >= 1 && ev.Epoch <= t.rec.Epoch {
		t.rec.Repeats++
		if t.rec.Events[i].Type != ev.Type {
			t.rec.RepeatConflicts++
		}
		writeJSON(w, http.StatusOK, struct{}{})
		return
	}
	if checkEpochLocked(w, t, ev.Epoch) {
		return
	}
	want := taskID + "/" + string(ev.Type)
	if ev.Type.Final() {
		want = taskID + "/final"
	}
	if ev.IdempotencyKey != want {
		t.rec.BadKeys++
	}
	t.keys[ev.IdempotencyKey] = len(t.rec.Events)
	t.rec.Events = append(t.rec.Events, cloneEvent(ev))
	if ev.Type.Final() {
		t.rec.FinalStored++
		if t.rec.Final == nil {
			final := cloneEvent(ev)
			t.rec.Final = &final
			t.rec.Leased = false
			s.dequeueLocked(t)
		}
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// logs is the log endpoint of a task.
func (s *Server) logs(w http.ResponseWriter, r *http.Request, caller, taskID string) {
	var c orchestrator.LogChunk
	if !decode(w, r, &c) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(s.clock.Now())
	t, ok := s.tasks[taskID]
	if !ok {
		writeError(w, http.StatusNotFound, codeNotFound, "no task "+taskID)
		return
	}
	t.rec.LogPosts++
	switch {
	case len(c.Data) > orchestrator.MaxLogChunk:
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest,
			fmt.Sprintf("chunk of %d bytes, more than %d", len(c.Data), orchestrator.MaxLogChunk))
		return
	case c.Offset < 0:
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest, "negative offset")
		return
	}
	// The holder first: a dispatcher that never held the task learns
	// nothing of its epochs.
	if c.Epoch >= 1 && c.Epoch <= t.rec.Epoch && s.notHolderLocked(w, t, caller, c.Epoch) {
		return
	}
	if checkEpochLocked(w, t, c.Epoch) {
		return
	}
	have := int64(len(t.rec.Log))
	if c.Offset > have {
		t.rec.LogGaps++
		writeError(w, http.StatusConflict, orchestrator.CodeLogGap,
			fmt.Sprintf("chunk at offset %d, the log has %d bytes", c.Offset, have))
		return
	}
	if end := c.Offset + int64(len(c.Data)); end > have {
		t.rec.Log = append(t.rec.Log, c.Data[have-c.Offset:]...)
	}
	if c.Final {
		t.rec.LogFinal = true
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// decode reads a JSON request body into v, answering 400 if it cannot.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody)).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, orchestrator.CodeBadRequest, "malformed JSON body: "+err.Error())
		return false
	}
	return true
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, orchestrator.ErrorBody{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

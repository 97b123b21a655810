package orchestrator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

var leaseNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// inPhase makes a table (with Kueue or not) holding task t-1 in phase p,
// by the transitions that lead there, and returns the task's handle.
func inPhase(t *testing.T, kueue bool, p phase) (*leaseTable, *task) {
	t.Helper()
	lt := newLeaseTable(kueue)
	key := types.NamespacedName{Namespace: "runners", Name: "rw-t-1"}
	a := adoption{id: "t-1", key: key, leaseID: "l-1", epoch: 1, seconds: 60}
	var tk *task
	switch p {
	case phaseCreating:
		tk, _, _, _ = lt.take(Lease{LeaseID: "l-1", Epoch: 1, LeaseSeconds: 60, Task: Task{ID: "t-1"}}, leaseNow, time.Minute, true)
	case phaseQueued:
		a.suspended = true
		tk, _ = lt.adopt(a, leaseNow)
	case phaseRunning:
		tk, _ = lt.adopt(a, leaseNow)
	case phaseFinished:
		a.ended = true
		tk, _ = lt.adopt(a, leaseNow)
	case phaseDiscarding:
		lt.discard("t-1", key)
		tk = lt.tasks["t-1"]
	}
	if tk == nil || tk.phase != p {
		t.Fatalf("setting up a task in phase %v: got %v", p, tk)
	}
	drain(lt)
	return lt, tk
}

// drain empties the table's wake-up channel.
func drain(lt *leaseTable) {
	select {
	case <-lt.freed():
	default:
	}
}

// woken tells whether the table woke the poll since the last drain.
func woken(lt *leaseTable) bool {
	select {
	case <-lt.freed():
		return true
	default:
		return false
	}
}

// Each phase transition moves a task only from the phases it leaves from
// (the table in leaseTable's comment); from any other it changes nothing
// and says so. A transition that frees a slot or a place in the queue
// wakes the poll.
func TestPhaseTransitions(t *testing.T) {
	t.Parallel()
	type move struct {
		to    phase
		woken bool
	}
	transitions := []struct {
		name string
		// do makes the transition and tells whether it was taken.
		do func(*leaseTable, *task) bool
		// legal are the moves, by the phase left, with Kueue.
		legal map[phase]move
	}{
		{
			name:  "created",
			do:    func(lt *leaseTable, tk *task) bool { before := tk.phase; lt.created(tk); return before != tk.phase },
			legal: map[phase]move{phaseCreating: {to: phaseQueued}},
		},
		{
			name:  "admitted",
			do:    (*leaseTable).admitted,
			legal: map[phase]move{phaseQueued: {to: phaseRunning, woken: true}}, // a place in the queue frees
		},
		{
			name:  "requeued",
			do:    (*leaseTable).requeued,
			legal: map[phase]move{phaseRunning: {to: phaseQueued, woken: true}}, // a slot frees
		},
		{
			name: "finished",
			do:   (*leaseTable).finished,
			legal: map[phase]move{
				phaseQueued:   {to: phaseFinished, woken: true},
				phaseRunning:  {to: phaseFinished, woken: true},
				phaseFinished: {to: phaseFinished},
			},
		},
	}
	phases := []phase{phaseCreating, phaseQueued, phaseRunning, phaseFinished, phaseDiscarding}
	for _, tr := range transitions {
		for _, from := range phases {
			t.Run(tr.name+" from "+from.String(), func(t *testing.T) {
				t.Parallel()
				lt, tk := inPhase(t, true, from)
				want, legal := tr.legal[from]
				if !legal {
					want = move{to: from}
				}
				if ok := tr.do(lt, tk); ok != legal {
					t.Errorf("%s from %v: taken %v, want %v", tr.name, from, ok, legal)
				}
				if got := tk.phase; got != want.to {
					t.Errorf("%s from %v: phase %v, want %v", tr.name, from, got, want.to)
				}
				if got := woken(lt); got != want.woken {
					t.Errorf("%s from %v: the poll woken %v, want %v", tr.name, from, got, want.woken)
				}
			})
		}
	}
}

// Without Kueue a created Job runs at once; adopting a suspended Job does
// not make it queued, since nothing queues it.
func TestCreatedWithoutKueueRuns(t *testing.T) {
	t.Parallel()
	lt, tk := inPhase(t, false, phaseCreating)
	if v := lt.created(tk); v.phase != phaseRunning {
		t.Errorf("created without Kueue: %v, want running", v.phase)
	}
	_, v := lt.adopt(adoption{id: "t-2", key: types.NamespacedName{Namespace: "runners", Name: "rw-t-2"}, leaseID: "l-2", suspended: true}, leaseNow)
	if v.phase != phaseRunning {
		t.Errorf("a suspended Job adopted without Kueue: %v, want running", v.phase)
	}
}

// A task let go leaves the table from any phase, and its lease is
// remembered as ended.
func TestForgetFromEveryPhase(t *testing.T) {
	t.Parallel()
	for _, p := range []phase{phaseCreating, phaseQueued, phaseRunning, phaseFinished} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			lt, tk := inPhase(t, true, p)
			lt.forget(tk)
			if _, _, held := lt.held("t-1"); held {
				t.Error("the task is still held")
			}
			if !lt.hasEnded("l-1") {
				t.Error("its lease is not remembered as ended")
			}
			if !woken(lt) {
				t.Error("the poll was not woken")
			}
		})
	}
}

// A Job being discarded leaves the table when discarded says it is gone,
// or when a new lease of its task comes; discarded does nothing to a task
// in another phase.
func TestDiscarding(t *testing.T) {
	t.Parallel()
	lt, _ := inPhase(t, true, phaseDiscarding)
	if _, _, held := lt.held("t-1"); held {
		t.Error("a Job being discarded is held as its task")
	}
	if free, _, _, held := lt.capacity(1, 1); free != 0 || len(held) != 0 {
		t.Errorf("with a Job being discarded: %d free, %v held; want 0 free (it holds a slot), none held", free, held)
	}
	if !lt.discarded("t-1") || !woken(lt) {
		t.Error("discarded: not dropped, or the poll not woken")
	}
	if free, _, _, _ := lt.capacity(1, 1); free != 1 {
		t.Errorf("%d free once discarded, want 1", free)
	}

	lt, _ = inPhase(t, true, phaseDiscarding)
	tk, d, _, _ := lt.take(Lease{LeaseID: "l-2", Epoch: 2, LeaseSeconds: 60, Task: Task{ID: "t-1"}}, leaseNow, time.Minute, true)
	if d != deliveredFresh || tk.phase != phaseCreating {
		t.Errorf("a new lease of a task whose Job is discarded: %v in %v, want a fresh task being created", d, tk.phase)
	}

	lt, tk = inPhase(t, true, phaseRunning)
	if lt.discarded("t-1") || tk.phase != phaseRunning {
		t.Error("discarded changed a running task")
	}
}

// The lease beside the phase changes only for the lease the task holds: a
// renewal answered for a lease re-issued meanwhile changes nothing; a Job
// being discarded has no lease to change.
func TestLeaseChanges(t *testing.T) {
	t.Parallel()
	backoff := func(failures int) time.Duration { return time.Duration(failures+1) * 15 * time.Second }
	t.Run("renewal failures back off within a third of the lease, and a renewal resets them", func(t *testing.T) {
		t.Parallel()
		lt, tk := inPhase(t, false, phaseRunning)
		var delays []time.Duration
		for range 3 {
			v, d, ok := lt.renewalFailed(tk, "l-1", leaseNow, backoff)
			if !ok || !v.renewAt.Equal(leaseNow.Add(d)) {
				t.Fatalf("renewalFailed: %v, next at %v", ok, v.renewAt)
			}
			delays = append(delays, d)
		}
		if diff := cmp.Diff([]time.Duration{15 * time.Second, 20 * time.Second, 20 * time.Second}, delays); diff != "" {
			t.Errorf("delays (-want +got):\n%s", diff)
		}
		if v, _ := lt.view(tk); v.renewFailures != 3 {
			t.Errorf("%d failures counted, want 3", v.renewFailures)
		}
		if !lt.extended(tk, "l-1") {
			t.Error("extended refused the lease held")
		}
		if v, _ := lt.view(tk); v.renewFailures != 0 {
			t.Errorf("%d failures counted after a renewal, want 0", v.renewFailures)
		}
	})
	t.Run("a lease gone is lost and wakes the poll until re-issued", func(t *testing.T) {
		t.Parallel()
		lt, tk := inPhase(t, false, phaseRunning)
		if v, ok := lt.gone(tk, "l-1", leaseNow); !ok || !v.lost() || !woken(lt) {
			t.Errorf("gone: %v, lost %v", ok, v.lost())
		}
		if free, _, lost, _ := lt.capacity(1, 1); !lost || free != 0 {
			t.Errorf("capacity with a lost lease: %d free, lost %v; want 0, true", free, lost)
		}
		if due := lt.due(leaseNow.Add(time.Hour)); len(due) != 0 {
			t.Error("a lost lease is renewed")
		}
		_, d, v, _ := lt.take(Lease{LeaseID: "l-2", Epoch: 2, LeaseSeconds: 30, Task: Task{ID: "t-1"}}, leaseNow, time.Minute, true)
		if d != deliveredReissued || v.lost() || v.leaseID != "l-2" || v.epoch != 2 || !v.renewAt.Equal(leaseNow.Add(10*time.Second)) || v.phase != phaseRunning {
			t.Errorf("re-issued: %v, %+v", d, v)
		}
	})
	t.Run("a stale lease changes nothing", func(t *testing.T) {
		t.Parallel()
		lt, tk := inPhase(t, false, phaseRunning)
		if _, _, ok := lt.renewalFailed(tk, "l-1", leaseNow, backoff); !ok {
			t.Fatal("renewalFailed refused the lease held")
		}
		before, _ := lt.view(tk)
		if lt.extended(tk, "l-0") {
			t.Error("extended took a lease not held")
		}
		if _, _, ok := lt.renewalFailed(tk, "l-0", leaseNow, backoff); ok {
			t.Error("renewalFailed took a lease not held")
		}
		if _, ok := lt.gone(tk, "l-0", leaseNow); ok {
			t.Error("gone took a lease not held")
		}
		after, _ := lt.view(tk)
		if diff := cmp.Diff(before, after, cmp.AllowUnexported(lease{}, cancellation{})); diff != "" {
			t.Errorf("the lease changed (-before +after):\n%s", diff)
		}
	})
	t.Run("cancellation, the runner seen running, events sent", func(t *testing.T) {
		t.Parallel()
		lt, tk := inPhase(t, false, phaseRunning)
		if !lt.cancelled(tk, "first") || lt.cancelled(tk, "second") {
			t.Error("cancelled: the first ask is not told apart from the next")
		}
		if v, first := lt.seenRunning(tk, leaseNow); !first || !v.runningAt.Equal(leaseNow) {
			t.Errorf("seenRunning: first %v at %v", first, v.runningAt)
		}
		if v, first := lt.seenRunning(tk, leaseNow.Add(time.Minute)); first || !v.runningAt.Equal(leaseNow) {
			t.Errorf("seenRunning again: first %v at %v, want the first time kept", first, v.runningAt)
		}
		lt.eventSent(tk, EventRunning)
		v, _ := lt.view(tk)
		if v.cancel == nil || v.cancel.reason != "second" || !v.sent[EventRunning] {
			t.Errorf("view: %+v, want cancelled for the latest reason and running sent", v)
		}
		if woken(lt) {
			t.Error("the poll was woken, and nothing freed")
		}
	})
	t.Run("a Job being discarded has no lease", func(t *testing.T) {
		t.Parallel()
		lt, tk := inPhase(t, false, phaseDiscarding)
		before := tk.clone()
		lt.extended(tk, "")
		lt.renewalFailed(tk, "", leaseNow, backoff)
		lt.gone(tk, "", leaseNow)
		lt.cancelled(tk, "r")
		lt.seenRunning(tk, leaseNow)
		lt.eventSent(tk, EventRunning)
		if diff := cmp.Diff(before, tk.clone(), cmp.AllowUnexported(lease{}, cancellation{})); diff != "" {
			t.Errorf("the discarded Job's entry changed (-before +after):\n%s", diff)
		}
	})
}

// lease's fields are written by the lease table alone: no other file of
// the package (tests aside) assigns one, or sets one in a literal.
func TestOnlyTheTableWritesALease(t *testing.T) {
	t.Parallel()
	fields := map[string]bool{}
	for f := range reflect.TypeFor[lease]().Fields() {
		fields[f.Name] = true
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	for _, name := range files {
		if name == "leases.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fs, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var targets []ast.Expr
			switch n := n.(type) {
			case *ast.AssignStmt:
				targets = n.Lhs
			case *ast.IncDecStmt:
				targets = []ast.Expr{n.X}
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); ok && (id.Name == "lease" || id.Name == "task") && len(n.Elts) > 0 {
					t.Errorf("%s: makes a %s; only the table does", fs.Position(n.Pos()), id.Name)
				}
			}
			for _, e := range targets {
				if ix, ok := e.(*ast.IndexExpr); ok {
					e = ix.X
				}
				if sel, ok := e.(*ast.SelectorExpr); ok && fields[sel.Sel.Name] {
					t.Errorf("%s: assigns a lease's %s; only the table's transitions do", fs.Position(e.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}

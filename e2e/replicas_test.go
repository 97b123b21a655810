//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/e2e/harness"
)

// startStandby starts d and waits until it is healthy, ready or not: a
// replica that does not lead is never ready.
func (d *dispatcherProcess) startStandby(ctx context.Context, t testing.TB) {
	t.Helper()
	if err := d.launch(); err != nil {
		t.Fatal(err)
	}
	d.awaitHealthy(ctx, t)
}

// awaitHealthy waits until d answers /healthz.
func (d *dispatcherProcess) awaitHealthy(ctx context.Context, t testing.TB) {
	t.Helper()
	if err := harness.WaitFor(ctx, "the dispatcher to be healthy", 30*time.Second, d.answers("/healthz")); err != nil {
		t.Fatalf("%v\n%s", err, d.log.String())
	}
}

// answers is a condition: path answers 200.
func (d *dispatcherProcess) answers(path string) func(context.Context) (bool, error) {
	return func(context.Context) (bool, error) {
		resp, err := http.Get("http://" + d.health + path)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}
}

// TestDispatcherReplicasFailover runs two dispatcher replicas of one ID
// with --leader-elect (kube source): only the leader dispatches (the standby
// is healthy, not ready), the leader is SIGKILLed while tasks arrive and the
// standby takes over once the lease expires, then hands over at once on a
// graceful stop. Every task ends once with one Job, never more than
// --max-concurrent at a time.
func TestDispatcherReplicasFailover(t *testing.T) {
	// Beside other tests: electionFlags.
	t.Parallel()
	f := features.New("dispatcher replicas").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("one leads, the other takes over, every task once", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			election := append([]string{"--simulated", "--succeeded-history", "1000"}, electionFlags...)
			// Each its own copy: startDispatcherProcess edits its arguments.
			a := startDispatcherProcess(ctx, t, cfg, ns, slices.Clone(election)...)
			b := startDispatcherProcess(ctx, t, cfg, ns, slices.Clone(election)...)
			t.Cleanup(func() { a.stop(os.Interrupt); b.stop(os.Interrupt) })
			a.startStandby(ctx, t)
			if err := harness.WaitFor(ctx, "the first replica to lead", 30*time.Second, a.answers("/readyz")); err != nil {
				t.Fatalf("%v\n%s", err, a.log.String())
			}
			b.startStandby(ctx, t)
			time.Sleep(2 * time.Second)
			if ready, _ := b.answers("/readyz")(ctx); ready {
				t.Fatal("the second replica is ready while the first leads")
			}
			watch := harness.WatchJobs(ctx, t, cfg, ns, 5)
			r := cfg.Client().Resources(ns)
			var tasks []*v1alpha1.RunnerTask
			submit := func(from, to int) {
				for i := from; i < to; i++ {
					rt := runnerTask(ns, fmt.Sprintf("t-%03d", i), "true")
					if err := r.Create(ctx, rt); err != nil {
						t.Fatal(err)
					}
					tasks = append(tasks, rt)
				}
			}
			submit(0, 20)
			time.Sleep(time.Second)
			killed := time.Now()
			a.stop(os.Kill)
			submit(20, 40)
			if err := harness.WaitForEvery(ctx, "the standby to lead", time.Minute, 100*time.Millisecond, b.answers("/readyz")); err != nil {
				t.Fatalf("%v\n%s", err, b.log.String())
			}
			t.Logf("failover after SIGKILL: the standby led %s after the leader died (lease duration 8s)", time.Since(killed).Round(100*time.Millisecond))

			// A graceful stop hands the lease over at once.
			a.startStandby(ctx, t)
			stopped := time.Now()
			b.stop(os.Interrupt)
			if err := harness.WaitForEvery(ctx, "the other replica to lead", time.Minute, 100*time.Millisecond, a.answers("/readyz")); err != nil {
				t.Fatalf("%v\n%s", err, a.log.String())
			}
			t.Logf("handover after SIGTERM: the standby led %s after the leader was asked to stop", time.Since(stopped).Round(100*time.Millisecond))
			submit(40, 60)

			for _, rt := range tasks {
				got := waitPhase(ctx, t, cfg, rt, a)
				if got.Status.Phase != v1alpha1.PhaseSucceeded {
					t.Errorf("task %s: %s %s: %s", rt.Name, got.Status.Phase, got.Status.Reason, got.Status.Message)
				}
			}
			jobs := map[string]int{}
			for _, j := range jobsOf(ctx, t, cfg, ns) {
				jobs[j.Annotations["runwarden.dev/task-id"]]++
			}
			for id, n := range jobs {
				if n != 1 {
					t.Errorf("task %s: %d Jobs", id, n)
				}
			}
			if len(jobs) != len(tasks) {
				t.Errorf("%d tasks have Jobs, want %d", len(jobs), len(tasks))
			}
			watch.Check(ctx, t)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// electionFlags elect a leader among replicas quickly: an 8 s lease, which
// a standby takes 8 s after it last saw it renewed. The leader renews every
// half second and stops (exits, by design) when it has not renewed for 6 s,
// each request given 3 s. The tests run beside others (docs/e2e.md), whose
// load can slow the API server's answers by seconds: with a 3 s deadline
// (1.5 s a request) a leader once stopped so, and with the standby gone
// too no replica was left. What the tests prove (one leader at a time,
// every task once, never more than --max-concurrent) holds for any lease;
// this one only makes each failover after a SIGKILL take 8 s, not 4, and
// leaves 2 s between the leader's deadline and the lease's end, not 1.
var electionFlags = []string{"--leader-elect", "--leader-elect-lease-duration", "8s", "--leader-elect-renew-deadline", "6s", "--leader-elect-retry-period", "500ms"}

// replicaSet is dispatcher processes of one ID, run with --leader-elect,
// kept running as their Deployment would keep them: a replica that exits
// of itself is started again as a standby. A leader that cannot renew its
// Lease within the renew deadline exits by design (the API server slowed
// by the suites beside it can do that), and a test that went on with the
// other replica alone could be left with none. Those exits are logged; an
// exit for any other reason (a crash) fails the test.
type replicaSet struct {
	ds []*dispatcherProcess

	mu sync.Mutex
	// down are the replicas the test stopped and has not started again:
	// left alone.
	down map[*dispatcherProcess]bool
	// from is where each replica's log of its current process starts.
	from map[*dispatcherProcess]int
	// exits says what each replica's own exits were, for the test's log;
	// crashes the ones that were not a lost lead.
	exits, crashes []string
}

// startReplicas starts n replicas of one dispatcher with args (which
// include --leader-elect): the first leads, the others stand by. Until the
// test ends, a replica that exits of itself is started again (replicaSet).
func startReplicas(ctx context.Context, t testing.TB, cfg *envconf.Config, ns string, n int, args ...string) *replicaSet {
	t.Helper()
	rs := &replicaSet{down: map[*dispatcherProcess]bool{}, from: map[*dispatcherProcess]int{}}
	for range n {
		// Each its own copy: startDispatcherProcess edits its arguments.
		rs.ds = append(rs.ds, startDispatcherProcess(ctx, t, cfg, ns, slices.Clone(args)...))
	}
	t.Cleanup(func() {
		for _, d := range rs.ds {
			d.stop(os.Interrupt)
		}
	})
	rs.mu.Lock()
	rs.from[rs.ds[0]] = rs.ds[0].log.Len()
	rs.mu.Unlock()
	rs.ds[0].start(ctx, t)
	for _, d := range rs.ds[1:] {
		rs.startStandby(ctx, t, d)
	}
	// Registered after the stop above, so run before it: the replicas are
	// no longer kept running once the test ends.
	done := make(chan struct{})
	stopped := make(chan struct{})
	go rs.keepRunning(done, stopped)
	t.Cleanup(func() {
		close(done)
		<-stopped
		rs.mu.Lock()
		defer rs.mu.Unlock()
		for _, e := range rs.exits {
			t.Logf("a replica exited of itself and was started again: %s", e)
		}
		for _, c := range rs.crashes {
			t.Errorf("a replica crashed: %s", c)
		}
	})
	return rs
}

// keepRunning starts again, every half second, the replicas that exited of
// themselves, until done is closed; then it closes stopped.
func (rs *replicaSet) keepRunning(done <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		rs.mu.Lock()
		for i, d := range rs.ds {
			if rs.down[d] || d.cmd == nil || d.cmd.Process == nil || d.cmd.ProcessState != nil || !exited(d.cmd.Process.Pid) {
				continue
			}
			state, err := d.cmd.Process.Wait()
			out := d.log.String()
			own := out[min(rs.from[d], len(out)):]
			what := fmt.Sprintf("replica %d at %s (%v %v)", i, time.Now().Format(time.TimeOnly), state, err)
			if strings.Contains(own, "leader election lost") {
				rs.exits = append(rs.exits, what+": its lead lost")
			} else {
				rs.crashes = append(rs.crashes, what+"\n"+tail(own, 3000))
			}
			rs.from[d] = d.log.Len()
			if err := d.launch(); err != nil {
				rs.crashes = append(rs.crashes, fmt.Sprintf("replica %d not started again: %v", i, err))
				rs.down[d] = true
			}
		}
		rs.mu.Unlock()
	}
}

// exited tells whether process pid has exited and waits to be reaped (a
// zombie): without reaping it, so that whoever stops it still can.
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's name, in parentheses that may hold
	// anything.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && strings.HasPrefix(string(b[i+1:]), " Z")
}

// stop stops replica d with sig; it stays down until startStandby.
func (rs *replicaSet) stop(d *dispatcherProcess, sig os.Signal) {
	rs.mu.Lock()
	rs.down[d] = true
	rs.mu.Unlock()
	d.stop(sig)
}

// startStandby starts replica d again, as startStandby does.
func (rs *replicaSet) startStandby(ctx context.Context, t testing.TB, d *dispatcherProcess) {
	t.Helper()
	rs.mu.Lock()
	rs.from[d] = d.log.Len()
	err := d.launch()
	if err == nil {
		delete(rs.down, d)
	}
	rs.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	d.awaitHealthy(ctx, t)
}

// leader is the replica that is ready, which only the leader is; nil if
// none is.
func (rs *replicaSet) leader(ctx context.Context) *dispatcherProcess {
	for _, d := range rs.ds {
		if ok, _ := d.answers("/readyz")(ctx); ok {
			return d
		}
	}
	return nil
}

// waitLeader waits until a replica leads and returns it.
func (rs *replicaSet) waitLeader(ctx context.Context, t testing.TB) *dispatcherProcess {
	t.Helper()
	var l *dispatcherProcess
	leads := func(ctx context.Context) (bool, error) {
		l = rs.leader(ctx)
		return l != nil, nil
	}
	if err := harness.WaitForEvery(ctx, "a replica to lead", time.Minute, 100*time.Millisecond, leads); err != nil {
		t.Fatalf("%v\n%s", err, rs.logs())
	}
	return l
}

// killLeader SIGKILLs the replica that leads and starts it again (it
// stands by, or leads if it wins the election), then waits until one
// leads.
func (rs *replicaSet) killLeader(ctx context.Context, t testing.TB) {
	t.Helper()
	l := rs.waitLeader(ctx, t)
	rs.stop(l, os.Kill)
	rs.startStandby(ctx, t, l)
	rs.waitLeader(ctx, t)
}

// logs is the end of each replica's log.
func (rs *replicaSet) logs() string {
	var b strings.Builder
	for i, d := range rs.ds {
		fmt.Fprintf(&b, "--- replica %d:\n%s\n", i, tail(d.log.String(), 3000))
	}
	return b.String()
}

// apiProxy forwards TCP connections to the API server until cut; from then
// on nothing more passes, either way, and new connections are held
// unanswered: a network partition between one replica and the API server.
type apiProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
}

func startAPIProxy(t testing.TB, cfg *envconf.Config) *apiProxy {
	t.Helper()
	u, err := url.Parse(cfg.Client().RESTConfig().Host)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{ln: ln, target: u.Host}
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	go p.serve()
	return p
}

func (p *apiProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		cut := p.cut
		p.mu.Unlock()
		if cut {
			continue // held, never answered
		}
		go func() {
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, up)
			p.mu.Unlock()
			go p.pipe(up, c)
			p.pipe(c, up)
		}()
	}
}

// pipe copies from src to dst until cut; then it drops what it reads.
func (p *apiProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.isCut() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *apiProxy) isCut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

func (p *apiProxy) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
}

// kubeconfig writes the suite's kubeconfig with the proxy as the server.
func (p *apiProxy) kubeconfig(t testing.TB, cfg *envconf.Config) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(cfg.KubeconfigFile())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range kc.Clusters {
		c.Server = "https://" + p.ln.Addr().String()
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDispatcherLeaderCutOff cuts the leader of two replicas (orchestrator
// source) off from the API server, as a network partition would, while it
// still reaches the orchestrator and tasks keep coming: it stops (exits,
// "leader election lost") before the standby can take the Lease, the
// standby carries on with the tasks, and every task ends once with one Job.
// The cut-off leader's log says when it stopped and why.
func TestDispatcherLeaderCutOff(t *testing.T) {
	// Beside other tests: electionFlags.
	t.Parallel()
	f := features.New("dispatcher leader cut off").
		Assess("the cut-off leader stops before the standby leads; every task once", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 10, MaxWait: 2 * time.Second})
			proxy := startAPIProxy(t, cfg)
			// A leader that cannot renew stops a renew deadline after the
			// retry period that follows its last renewal (6.5 s); a standby
			// takes over a lease duration after it last saw a renewal (12 s).
			// The deadline is electionFlags' (the API server may answer
			// the standby late while other tests run, and it must not stop
			// once it leads); the lease keeps 5.5 s between the two, as
			// 2.5 s were with a 3 s deadline and a 6 s lease.
			election := []string{"--leader-elect", "--leader-elect-lease-duration", "12s", "--leader-elect-renew-deadline", "6s", "--leader-elect-retry-period", "500ms"}
			args := slices.Concat(orchestratorFlags(o), []string{"--simulated", "--preflight=false", "--stream-logs=false", "--succeeded-history", "1000"}, election)
			a := startDispatcherProcess(ctx, t, cfg, ns, append(slices.Clone(args), "--kubeconfig", proxy.kubeconfig(t, cfg))...)
			b := startDispatcherProcess(ctx, t, cfg, ns, slices.Clone(args)...)
			t.Cleanup(func() { a.stop(os.Interrupt); b.stop(os.Interrupt) })
			a.start(ctx, t)
			b.startStandby(ctx, t)
			ids := orchestratorTasks(o.srv, "before", 10)
			waitAllDone(ctx, t, o.srv, len(ids), time.Minute, a)

			exited := make(chan time.Time, 1)
			go func() {
				_, _ = a.cmd.Process.Wait()
				exited <- time.Now()
			}()
			cut := time.Now()
			proxy.cutOff()
			ids = append(ids, orchestratorTasks(o.srv, "during", 10)...)
			var led time.Time
			leads := func(ctx context.Context) (bool, error) {
				ok, _ := b.answers("/readyz")(ctx)
				if ok {
					led = time.Now()
				}
				return ok, nil
			}
			if err := harness.WaitForEvery(ctx, "the standby to lead", time.Minute, 50*time.Millisecond, leads); err != nil {
				t.Fatalf("%v\n%s", err, b.log.String())
			}
			select {
			case stopped := <-exited:
				if !stopped.Before(led) {
					t.Errorf("the cut-off leader stopped %s after the cut, the standby led %s after it: both led at once\n%s", stopped.Sub(cut), led.Sub(cut), tail(a.log.String(), 3000))
				}
				t.Logf("cut off at %s: the leader stopped after %s, the standby led after %s (retry period 0.5s, renew deadline 6s, lease 12s); the cut-off leader's log ends:\n%s",
					cut.UTC().Format(time.RFC3339Nano), stopped.Sub(cut).Round(10*time.Millisecond), led.Sub(cut).Round(10*time.Millisecond), tail(a.log.String(), 1500))
			case <-time.After(30 * time.Second):
				t.Fatalf("the cut-off leader still runs 30s after the standby led\n%s", tail(a.log.String(), 3000))
			}
			if !strings.Contains(a.log.String(), "leader election lost") {
				t.Errorf("the cut-off leader's log does not say why it stopped:\n%s", tail(a.log.String(), 3000))
			}
			waitAllDone(ctx, t, o.srv, len(ids), 2*time.Minute, b)
			checkExactlyOnce(ctx, t, cfg, ns, o.srv, ids)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

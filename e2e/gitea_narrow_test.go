//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/proto"
	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/e2e/harness"
)

// giteaWindow is a moment of a task's report at which the leader is
// killed: when a report call of the kind match picks arrives, held by the
// proxy in front of Gitea.
type giteaWindow struct {
	name string
	// match picks the call: its method ("UpdateTask", "UpdateLog"), the
	// decoded request, and whether it is the task's first report call.
	match func(method string, req proto.Message, first bool) bool
	// forward: the call reaches Gitea before the kill. answer: its answer
	// reaches the dispatcher too (the kill falls after it).
	forward, answer bool
	// fetch: the window is FetchTask's answer holding the task, at Gitea
	// and kept from the dispatcher. The job cannot run then (Gitea gives
	// its payload once): the new leader reports it failed, saying why,
	// and makes no Job.
	fetch bool
}

func isFinal(method string, req proto.Message) bool {
	r, ok := req.(*runnerv1.UpdateTaskRequest)
	return ok && method == "UpdateTask" && r.GetState().GetResult() != runnerv1.Result_RESULT_UNSPECIFIED
}

var giteaWindows = []giteaWindow{
	{name: "the Job made, its first report not sent", match: func(_ string, _ proto.Message, first bool) bool { return first }},
	{name: "the first report at Gitea, its answer lost", match: func(_ string, _ proto.Message, first bool) bool { return first }, forward: true},
	{name: "the log's end at Gitea, its answer lost", match: func(method string, req proto.Message, _ bool) bool {
		r, ok := req.(*runnerv1.UpdateLogRequest)
		return ok && method == "UpdateLog" && r.GetNoMore()
	}, forward: true},
	{name: "the final update not sent", match: func(method string, req proto.Message, _ bool) bool { return isFinal(method, req) }},
	{name: "the final update at Gitea, its answer lost", match: func(method string, req proto.Message, _ bool) bool { return isFinal(method, req) }, forward: true},
	{name: "the final answer received (the kill races the reported mark)", match: func(method string, req proto.Message, _ bool) bool { return isFinal(method, req) }, forward: true, answer: true},
	// Last: the new leader finds the lost task past its newest Job's.
	{name: "FetchTask's answer at Gitea, lost before the Job was made", fetch: true, forward: true},
}

// giteaTrap is a reverse proxy in front of Gitea that passes every call
// and, once armed with a window, holds the first report call it matches
// until the test has killed the leader that made it.
type giteaTrap struct {
	rp      *httputil.ReverseProxy
	url     string
	mu      sync.Mutex
	seen    map[int64]bool
	armed   *giteaWindow
	hit     chan int64
	release chan struct{}
}

func startGiteaTrap(t testing.TB, target string) *giteaTrap {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &giteaTrap{rp: httputil.NewSingleHostReverseProxy(u), seen: map[int64]bool{}, hit: make(chan int64, 1)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	p.url = "http://" + ln.Addr().String()
	return p
}

// arm has the next call w matches held; release lets it go on once the
// test has killed its sender.
func (p *giteaTrap) arm(w giteaWindow) (release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = &w
	ch := make(chan struct{})
	p.release = ch
	return sync.OnceFunc(func() { close(ch) })
}

func (p *giteaTrap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	method := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	var req proto.Message
	switch method {
	case "FetchTask":
		p.mu.Lock()
		win := p.armed
		release := p.release
		p.mu.Unlock()
		if win == nil || !win.fetch {
			p.rp.ServeHTTP(w, r)
			return
		}
		// Uncompressed answers, to read the task from.
		r.Header.Del("Accept-Encoding")
		r.Header.Del("Connect-Accept-Encoding")
		rec := httptest.NewRecorder()
		p.rp.ServeHTTP(rec, r)
		var resp runnerv1.FetchTaskResponse
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Encoding") != "" || proto.Unmarshal(rec.Body.Bytes(), &resp) != nil || resp.GetTask() == nil {
			maps.Copy(w.Header(), rec.Header())
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		p.mu.Lock()
		p.armed = nil
		p.mu.Unlock()
		p.hit <- resp.GetTask().GetId()
		<-release
		http.Error(w, "giteaTrap: the dispatcher was killed", http.StatusServiceUnavailable)
		return
	case "UpdateTask":
		req = &runnerv1.UpdateTaskRequest{}
	case "UpdateLog":
		req = &runnerv1.UpdateLogRequest{}
	default:
		p.rp.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err := proto.Unmarshal(body, req); err != nil {
		http.Error(w, "giteaTrap: not a proto "+method+": "+err.Error(), http.StatusBadRequest)
		return
	}
	var id int64
	switch m := req.(type) {
	case *runnerv1.UpdateTaskRequest:
		id = m.GetState().GetId()
	case *runnerv1.UpdateLogRequest:
		id = m.GetTaskId()
	}
	// A new leader's sweep asks about task IDs with a bare state (no
	// steps, no result): not a report.
	if u, ok := req.(*runnerv1.UpdateTaskRequest); ok && len(u.GetState().GetSteps()) == 0 && u.GetState().GetResult() == runnerv1.Result_RESULT_UNSPECIFIED {
		p.rp.ServeHTTP(w, r)
		return
	}
	p.mu.Lock()
	first := !p.seen[id]
	p.seen[id] = true
	win := p.armed
	if win != nil && !win.fetch && win.match(method, req, first) {
		p.armed = nil
	} else {
		win = nil
	}
	release := p.release
	p.mu.Unlock()
	if win == nil {
		p.rp.ServeHTTP(w, r)
		return
	}
	out := w
	if win.forward && !win.answer {
		// Gitea acts on the call; the answer is kept from the dispatcher.
		out = httptest.NewRecorder()
	}
	if win.forward {
		p.rp.ServeHTTP(out, r)
		if f, ok := out.(http.Flusher); ok {
			f.Flush()
		}
	}
	p.hit <- id
	<-release
	if !win.forward || !win.answer {
		http.Error(w, "giteaTrap: the dispatcher was killed", http.StatusServiceUnavailable)
	}
}

// TestGiteaSourceNarrowWindows kills the leader of two dispatcher replicas
// serving Gitea at each narrow window of a task's report, one task each,
// held there by a proxy in front of Gitea: before the first report, with
// the first report or the log's end at Gitea but its answer lost, with the
// final update not sent, at Gitea with its answer lost, and answered but
// around the reported mark. The standby takes the task over from its Job
// each time: the job ends success at Gitea, its record once in its log, one
// Job for it, marked reported. Last, FetchTask's answer holding a task
// reaches Gitea but not the dispatcher: Gitea gives a job's payload once,
// so that job cannot run; the new leader finds it past its newest Job's
// task and reports it failed, saying why, at once rather than Gitea's ten
// minutes later, and makes no Job for it.
func TestGiteaSourceNarrowWindows(t *testing.T) {
	t.Parallel()
	f := features.New("gitea source narrow windows").
		Assess("the leader killed in each window of a report, each job reported once", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			parent := ctx
			ctx, cancel := context.WithTimeout(ctx, 14*time.Minute)
			defer cancel()
			g := harness.StartGitea(ctx, t, suite.RepoRoot, "127.0.0.1")
			if err := g.CreateRepo(ctx, "windows"); err != nil {
				t.Fatal(err)
			}
			trap := startGiteaTrap(t, g.URL)
			ctl := controlNamespace(ctx, t, cfg, ns)
			token := g.RegistrationTokenFile(t)
			rs := startReplicas(ctx, t, cfg, ns, 2, append([]string{"--simulated", "--preflight=false",
				"--succeeded-history", "1000", "--failed-history", "1000",
				"--source=gitea", "--gitea-url=" + trap.url, "--gitea-labels=sim", "--gitea-identity-secret=" + ctl + "/gitea-runner",
				"--gitea-steps-image=busybox:stable", "--gitea-registration-token-file=" + token,
				"--gitea-fetch-interval=200ms", "--gitea-report-interval=500ms"}, electionFlags...)...)
			for i, w := range giteaWindows {
				name := fmt.Sprintf("w%d", i)
				release := trap.arm(w)
				err := g.PutFiles(ctx, "windows", map[string]string{
					name + ".txt":                       w.name,
					".gitea/workflows/" + name + ".yml": fmt.Sprintf("on:\n  push:\n    paths: ['%s.txt']\njobs:\n  %s:\n    runs-on: sim\n    steps:\n      - run: echo %s\n", name, name, name),
				})
				if err != nil {
					t.Fatal(err)
				}
				select {
				case id := <-trap.hit:
					t.Logf("%s: task %d held at %q; the leader killed", name, id, w.name)
				case <-time.After(2 * time.Minute):
					release()
					t.Fatalf("%s (%s): no call of that window in 2m\n%s", name, w.name, rs.logs())
				case <-ctx.Done():
					release()
					t.Fatal(ctx.Err())
				}
				rs.killLeader(ctx, t)
				release()
				var got harness.GiteaJob
				err = harness.WaitFor(ctx, name+"'s job to end at Gitea", 2*time.Minute, func(ctx context.Context) (bool, error) {
					all, err := g.Jobs(ctx, "windows")
					if err != nil {
						return false, err
					}
					for _, j := range all {
						if j.Name == name {
							got = j
						}
					}
					return got.Status == "completed", nil
				})
				if err != nil {
					t.Fatalf("%s (%s): %v: %+v\n%s", name, w.name, err, got, rs.logs())
				}
				log, err := g.Log(ctx, "windows", got.ID)
				jobs := i + 1
				switch {
				case w.fetch:
					jobs = i
					if got.Conclusion != "failure" || err != nil || !strings.Contains(log, "before its Job was made") {
						t.Errorf("%s (%s): %s (%v), want failure saying the job was lost before its Job was made:\n%s", name, w.name, got.Conclusion, err, log)
					}
				case got.Conclusion != "success" || err != nil || strings.Count(log, "runwarden: record: pod ") != 1:
					t.Errorf("%s (%s): %s, its record %d times in its log (%v), want success and once:\n%s", name, w.name, got.Conclusion, strings.Count(log, "runwarden: record: pod "), err, log)
				}
				err = harness.WaitFor(ctx, name+"'s Job marked reported, one Job each", time.Minute, func(ctx context.Context) (bool, error) {
					var list batchv1.JobList
					if err := cfg.Client().Resources(ns).List(ctx, &list); err != nil {
						return false, err
					}
					reported := 0
					for _, j := range list.Items {
						if j.Annotations[job.AnnotationReported] != "" {
							reported++
						}
					}
					if len(list.Items) > jobs {
						return false, fmt.Errorf("%d Jobs, want %d", len(list.Items), jobs)
					}
					return reported == jobs && len(list.Items) == jobs, nil
				})
				if err != nil {
					t.Errorf("%s (%s): %v\n%s", name, w.name, err, rs.logs())
				}
			}
			all, err := g.Jobs(ctx, "windows")
			if err != nil || len(all) != len(giteaWindows) {
				t.Errorf("Gitea holds %d jobs (%v), want %d, one a window", len(all), err, len(giteaWindows))
			}
			return parent
		}).Feature()
	testenv.Test(t, f)
}

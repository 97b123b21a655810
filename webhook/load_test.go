package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/policies"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/cert"
	"github.com/runwarden/runwarden/webhook/policy"
)

// BenchmarkWebhookLoad is the load test: admission requests over TLS on
// loopback, at fixed rates (open loop, latency measured from each request's
// scheduled time, so queueing counts) and at saturation (closed loop), each
// for a bounded time, against these servers side by side:
//   - target=runwarden: the webhook's admission handler behind a TLS server,
//     with the shipped policies and a platform configuration that turns most
//     of them on, sent one runner pod again and again (pods of one template:
//     after the first, each decision comes from the decision cache);
//   - target=runwarden-per-task: the same server sent a new task's pod each
//     time, the runner container's variables holding a value of the task's
//     own (DEPLOY_REF), as a task's variables make each runner pod differ
//     (the decision cache keys on the containers' fields the policies read,
//     not on the variables' values: webhook/policy/elements.go);
//   - target=decode-only: the floor of any pod webhook built on the
//     Kubernetes API types, which decodes the review with its pod and answers
//     runwarden's patch without deciding anything;
//   - target=opa-server: what users run instead, `opa run --server` with the
//     same policies, asked for the same decision on the same input over TLS;
//   - target=empty: the ceiling, a TLS handler that answers a fixed
//     AdmissionReview.
//
// It reports p50, p99 and p999 latency from schedule, p99 from sending,
// the generator's own lateness (late-p99-ms: Go's timers on Linux wake up
// to a millisecond late, which every from-schedule figure includes) and the
// achieved throughput, over 20 s per measurement (RUNWARDEN_LOAD_DURATION;
// with 5 s a few garbage collections move the p99 by a tenth). The
// load generator runs in its own process (this test binary, started again
// with RUNWARDEN_LOADGEN set), so its garbage collector and goroutines do not
// stop the server's; both share the machine's cores, as a real API server
// and webhook would on a small node. `make bench-webhook` runs it.
func BenchmarkWebhookLoad(b *testing.B) {
	duration := 20 * time.Second
	if d := os.Getenv("RUNWARDEN_LOAD_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			b.Fatal(err)
		}
	}
	review, input := loadRequest(b, "")
	perTask, _ := loadRequest(b, taskSeq)
	var patch []byte // runwarden's answer, for the decode-only target
	standard := []string{"rate=1000", "rate=3000", "saturation"}
	targets := []struct {
		name  string
		start func(b *testing.B) (url string, body []byte)
		modes []string
	}{
		{"runwarden", func(b *testing.B) (string, []byte) { return startRunwarden(b), review }, standard},
		// At 100/s too: the rate at which a busy dispatcher makes runner
		// pods.
		{"runwarden-per-task", func(b *testing.B) (string, []byte) { return startRunwarden(b), perTask }, []string{"rate=100", "rate=1000", "rate=3000", "saturation"}},
		{"decode-only", func(b *testing.B) (string, []byte) { return startDecodeOnly(b, patch), review }, standard},
		{"opa-server", func(b *testing.B) (string, []byte) { return startOPA(b), input }, standard},
		{"empty", func(b *testing.B) (string, []byte) { return startEmpty(b), review }, standard},
	}
	for _, tgt := range targets {
		url, body := tgt.start(b)
		client := tlsClient()
		// Warm up connections and caches, and check the answer is a decision.
		for range 50 {
			if err := post(client, url, body); err != nil {
				b.Fatalf("%s: %v", tgt.name, err)
			}
		}
		got := answer(b, client, url, body)
		if tgt.name != "empty" && !strings.Contains(got, "AWS_ROLE_ARN") {
			b.Fatalf("%s did not answer with the decision: %s", tgt.name, got)
		}
		if tgt.name == "runwarden" {
			patch = []byte(got)
		}
		for _, mode := range tgt.modes {
			b.Run(fmt.Sprintf("target=%s/%s", tgt.name, mode), func(b *testing.B) {
				var res loadResult
				for b.Loop() {
					res = runGenerator(b, url, body, mode, duration)
				}
				lat, svc, errs, elapsed := res.Latencies, res.Service, res.Errors, res.Elapsed
				switch {
				case errs > 0 && tgt.name == "opa-server":
					// Past its capacity the open loop's queue outgrows the
					// client's 10 s timeout: that is the measurement.
					b.ReportMetric(float64(errs), "timeouts")
				case errs > 0:
					b.Errorf("%d requests failed", errs)
				}
				if mode != "saturation" && len(svc) == len(lat) {
					// How late the generator sent each request: its own
					// timer's lateness, in every from-schedule figure.
					late := make([]time.Duration, len(lat))
					for i := range lat {
						late[i] = lat[i] - svc[i]
					}
					sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
					b.ReportMetric(pct(late, 0.99), "late-p99-ms")
				}
				sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
				sort.Slice(svc, func(i, j int) bool { return svc[i] < svc[j] })
				b.ReportMetric(pct(svc, 0.99), "p99-sent-ms")
				b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "req/s")
				b.ReportMetric(pct(lat, 0.50), "p50-ms")
				b.ReportMetric(pct(lat, 0.99), "p99-ms")
				b.ReportMetric(pct(lat, 0.999), "p999-ms")
			})
		}
	}
}

// loadResult is what a generator process reports.
type loadResult struct {
	// Latencies count from each request's scheduled time (open loop) or its
	// sending (closed loop): queueing in the generator counts.
	Latencies []time.Duration
	// Service count from the moment each request was sent.
	Service []time.Duration
	Errors  int
	Elapsed time.Duration
}

// TestMain makes this test binary a load generator when RUNWARDEN_LOADGEN
// is set (see runGenerator).
func TestMain(m *testing.M) {
	if os.Getenv("RUNWARDEN_LOADGEN") != "" {
		os.Exit(generate())
	}
	os.Exit(m.Run())
}

// runGenerator starts this test binary as a load generator process and
// returns what it measured.
func runGenerator(b *testing.B, url string, body []byte, mode string, d time.Duration) loadResult {
	b.Helper()
	bodyFile := filepath.Join(b.TempDir(), "body.json")
	if err := os.WriteFile(bodyFile, body, 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// The generator collects at GOGC=400 whatever the servers' GOGC (this
	// process's), so a run that changes the servers' changes theirs alone.
	cmd.Env = append(os.Environ(), "RUNWARDEN_LOADGEN="+mode, "RUNWARDEN_LOADGEN_URL="+url,
		"RUNWARDEN_LOADGEN_BODY="+bodyFile, "RUNWARDEN_LOADGEN_DURATION="+d.String(), "GOGC=400")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("load generator: %v\n%s", err, stderr.String())
	}
	var res loadResult
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("load generator output: %v", err)
	}
	return res
}

// generate is the load generator process: it reads its job from the
// environment and writes a loadResult as JSON on standard output.
func generate() int {
	mode := os.Getenv("RUNWARDEN_LOADGEN")
	d, err := time.ParseDuration(os.Getenv("RUNWARDEN_LOADGEN_DURATION"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	first, err := os.ReadFile(os.Getenv("RUNWARDEN_LOADGEN_BODY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	url := os.Getenv("RUNWARDEN_LOADGEN_URL")
	client := tlsClient()
	for range 20 { // warm the connection
		_ = post(client, url, first)
	}
	body := bodies(first)
	var res loadResult
	if mode == "saturation" {
		res.Latencies, res.Errors, res.Elapsed = closedLoop(client, url, body, 16, d)
		res.Service = res.Latencies
	} else {
		var rate int
		if _, err := fmt.Sscanf(mode, "rate=%d", &rate); err != nil || rate < 1 {
			fmt.Fprintf(os.Stderr, "bad mode %q\n", mode)
			return 2
		}
		res.Latencies, res.Service, res.Errors, res.Elapsed = openLoop(client, url, body, rate, d)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// taskSeq stands in the per-task request for a value of the task's own, as
// a task's variables make each runner pod's containers differ: the
// generator gives each request its own number in its place.
const taskSeq = "task-seq-000000000000"

// bodies returns the body of each request: body itself, or, if it holds
// taskSeq, a copy with a number of the same width in its place, a new one
// for each request, so that no two requests are the same task.
func bodies(body []byte) func() []byte {
	if !bytes.Contains(body, []byte(taskSeq)) {
		return func() []byte { return body }
	}
	var n atomic.Int64
	return func() []byte {
		seq := fmt.Sprintf("task-seq-%012d", n.Add(1))
		return bytes.ReplaceAll(body, []byte(taskSeq), []byte(seq))
	}
}

func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)))
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return float64(sorted[i].Microseconds()) / 1000
}

// openLoop sends rate requests per second for d, each at its scheduled time.
func openLoop(c *http.Client, url string, body func() []byte, rate int, d time.Duration) ([]time.Duration, []time.Duration, int, time.Duration) {
	n := int(float64(rate) * d.Seconds())
	interval := time.Second / time.Duration(rate)
	lat := make([]time.Duration, n)
	svc := make([]time.Duration, n)
	var errs int
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256) // at most 256 in flight
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		time.Sleep(time.Until(at))
		sem <- struct{}{}
		req := body()
		wg.Go(func() {
			defer func() { <-sem }()
			sent := time.Now()
			err := post(c, url, req)
			lat[i] = time.Since(at)
			svc[i] = time.Since(sent)
			if err != nil {
				mu.Lock()
				errs++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat, svc, errs, time.Since(start)
}

// closedLoop runs workers that each send a request as soon as the last one
// returns, for d.
func closedLoop(c *http.Client, url string, body func() []byte, workers int, d time.Duration) ([]time.Duration, int, time.Duration) {
	var mu sync.Mutex
	var lat []time.Duration
	var errs int
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for range workers {
		wg.Go(func() {
			var mine []time.Duration
			bad := 0
			for time.Now().Before(deadline) {
				req := body()
				t := time.Now()
				if err := post(c, url, req); err != nil {
					bad++
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	return lat, errs, time.Since(start)
}

func answer(b *testing.B, c *http.Client, url string, body []byte) string {
	b.Helper()
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, _ := io.ReadAll(resp.Body)
	if strings.Contains(url, "mutate-pods") {
		// The webhook's patch is base64 in the AdmissionReview.
		var ar admissionv1.AdmissionReview
		if err := json.Unmarshal(out, &ar); err == nil && ar.Response != nil {
			return string(ar.Response.Patch)
		}
	}
	return string(out)
}

func tlsClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback test servers with throwaway certificates
		MaxIdleConnsPerHost: 512,
		ForceAttemptHTTP2:   true,
	}}
}

func post(c *http.Client, url string, body []byte) error {
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return nil
}

// loadPlatform is the platform configuration of the load test.
const loadPlatform = `
workloadIdentity: {aws: {enabled: true}}
secretStores: {vault: {enabled: true, address: "https://vault:8200", secretName: vault-token}}
secretRefs: {allowedPatterns: ["vault:team-a:secret/**"]}
scheduling:
  nodeSelector: {runwarden.dev/pool: runner}
  tolerations: [{key: runwarden.dev/pool, operator: Equal, value: runner, effect: NoSchedule}]
  doNotEvict: true
shape: {requireResources: true, allowedRegistries: [registry.example.com]}
`

func loadPod() *corev1.Pod {
	res := corev1.ResourceRequirements{}
	_ = yaml.Unmarshal([]byte("{requests: {cpu: '1', memory: 1Gi}, limits: {cpu: '1', memory: 1Gi}}"), &res)
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "task-1-", Namespace: "team-a", Labels: map[string]string{contract.LabelRunner: "true", "runwarden.dev/task-id": "1"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "task-1", UID: "job-uid-1", Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{ServiceAccountName: "runner", Containers: []corev1.Container{{
			Name: "main", Image: "registry.example.com/runner:1", Resources: res,
			Env: []corev1.EnvVar{{Name: "DB_PASSWORD", Value: "${vault:secret/db.password@team-a}"}},
		}}},
	}
}

func loadObjects() (*corev1.Namespace, *corev1.ServiceAccount) {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a", Annotations: map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}}
}

// loadRequest returns the AdmissionReview the API server would send, and
// the OPA data API request for the same decision on the same input. With a
// task value, the runner container also has a variable of the task's
// (DEPLOY_REF) set to it.
func loadRequest(b *testing.B, task string) (review, opaInput []byte) {
	b.Helper()
	pod := loadPod()
	if task != "" {
		c := &pod.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "DEPLOY_REF", Value: task})
	}
	raw, _ := json.Marshal(pod)
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "team-a", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
			UserInfo: authenticationv1.UserInfo{Username: rwadmission.DefaultJobControllerUsers[0]},
		},
	}
	review, _ = json.Marshal(ar)
	cfg := map[string]any{}
	_ = yaml.Unmarshal([]byte(loadPlatform), &cfg)
	ns, sa := loadObjects()
	in, _, err := rwadmission.BuildInput(b.Context(), rwadmission.ClusterLookups(fake.NewClientBuilder().WithObjects(ns, sa).Build(), nil), pod, "CREATE", "u", nil, cfg)
	if err != nil {
		b.Fatal(err)
	}
	opaInput, _ = json.Marshal(map[string]any{"input": in})
	return review, opaInput
}

func startRunwarden(b *testing.B) string {
	b.Helper()
	set, err := policy.Load(b.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cfg := map[string]any{}
	_ = yaml.Unmarshal([]byte(loadPlatform), &cfg)
	ns, sa := loadObjects()
	h := rwadmission.New(rwadmission.Options{
		Policies: staticSet{set}, Reader: sharedReader{ns: ns, sa: sa}, Jobs: sharedReader{ns: ns, sa: sa}, Config: cfg, Mutate: true,
	})
	return serveTLS(b, rwadmission.Serve(h, 0, make(chan struct{})))
}

// sharedReader hands out its objects without copies, as the webhook's
// cache does (UnsafeDisableDeepCopy).
type sharedReader struct {
	client.Reader
	ns *corev1.Namespace
	sa *corev1.ServiceAccount
}

func (r sharedReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	switch o := obj.(type) {
	case *corev1.Namespace:
		*o = *r.ns
	case *corev1.ServiceAccount:
		*o = *r.sa
	case *batchv1.Job:
		// The Job a runner pod belongs to (read from the API server in
		// the webhook: one read per runner pod).
		*o = batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, UID: "job-uid-1", Labels: map[string]string{contract.LabelDispatcher: "d-1"}},
			Spec:       batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{contract.LabelRunner: "true"}}}},
		}
	default:
		return fmt.Errorf("unexpected %T %s", obj, key)
	}
	return nil
}

// startDecodeOnly serves the floor of any pod webhook written with the
// Kubernetes API types: it decodes the AdmissionReview with its pod in one
// pass, as the API machinery decodes (sigs.k8s.io/json), decides nothing,
// and answers with a fixed patch (runwarden's for the same request). Its
// server, like runwarden's, handles each request on the HTTP server's
// goroutine; the difference between the two is runwarden's own work.
func startDecodeOnly(b *testing.B, patch []byte) string {
	b.Helper()
	type podRequest struct {
		admissionv1.AdmissionRequest
		Object *corev1.Pod `json:"object"`
	}
	type podReview struct {
		metav1.TypeMeta
		Request *podRequest `json:"request"`
	}
	pt := admissionv1.PatchTypeJSONPatch
	return serveTLS(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var ar podReview
		if err == nil {
			err = kjson.UnmarshalCaseSensitivePreserveInts(body, &ar)
		}
		if err != nil || ar.Request == nil || ar.Request.Object == nil || len(ar.Request.Object.Spec.Containers) == 0 {
			http.Error(w, fmt.Sprintf("not a pod review: %v", err), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(admissionv1.AdmissionReview{
			TypeMeta: ar.TypeMeta,
			Response: &admissionv1.AdmissionResponse{UID: ar.Request.UID, Allowed: true, PatchType: &pt, Patch: patch},
		})
	}))
}

func startEmpty(b *testing.B) string {
	b.Helper()
	resp, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Response: &admissionv1.AdmissionResponse{UID: "1", Allowed: true},
	})
	return serveTLS(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(resp)
	}))
}

// serveTLS serves h over TLS (HTTP/2) on loopback for the benchmark, at
// the mutating webhook's path.
func serveTLS(b *testing.B, h http.Handler) string {
	b.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	b.Cleanup(srv.Close)
	return srv.URL + MutatePath
}

// startOPA runs the pinned opa binary as a TLS server with the shipped
// policies, or skips saying how to build it.
func startOPA(b *testing.B) string {
	b.Helper()
	out, err := exec.Command("../hack/tools.sh", "path", "opa").Output()
	if err != nil {
		b.Skip("skipped: hack/tools.sh path opa failed")
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "opa")
	if _, err := os.Stat(bin); err != nil {
		b.Skipf("skipped: %s is not built (hack/tools.sh opa)", bin)
	}
	dir := b.TempDir()
	certs, err := cert.New(cert.Options{Dir: filepath.Join(dir, "certs"), Hosts: []string{"127.0.0.1"}})
	if err != nil {
		b.Fatal(err)
	}
	if err := certs.Ensure(b.Context()); err != nil {
		b.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "certs", cert.CertFile), filepath.Join(dir, "certs", cert.KeyFile)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	var files []string
	entries, _ := policies.FS.ReadDir(".")
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "_test.rego") {
			p := filepath.Join(dir, e.Name())
			data, _ := policies.FS.ReadFile(e.Name())
			if err := os.WriteFile(p, data, 0o644); err != nil {
				b.Fatal(err)
			}
			files = append(files, p)
		}
	}
	cmd := exec.Command(bin, append([]string{"run", "--server", "--addr", addr, "--tls-cert-file", certFile, "--tls-private-key-file", keyFile, "--log-level", "error", "--disable-telemetry"}, files...)...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	url := "https://" + addr + "/v1/data/runwarden/admission/decision"
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if post(tlsClient(), url, []byte(`{"input":{}}`)) == nil || strings.Contains(logs.String(), "error") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ctx.Err() != nil {
		b.Fatalf("opa did not start: %s", logs.String())
	}
	return url
}

// TestLoadBodiesAreDistinctTasks checks the per-task target's requests: each
// a valid review of its own task, and the others' requests all the same.
func TestLoadBodiesAreDistinctTasks(t *testing.T) {
	pod := loadPod()
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "DEPLOY_REF", Value: taskSeq})
	body, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	next := bodies(body)
	seen := map[string]bool{}
	for range 3 {
		got := next()
		var p corev1.Pod
		if err := json.Unmarshal(got, &p); err != nil {
			t.Fatalf("a request is not JSON: %v", err)
		}
		v := p.Spec.Containers[0].Env[len(p.Spec.Containers[0].Env)-1].Value
		if v == taskSeq || len(v) != len(taskSeq) || seen[v] {
			t.Errorf("task value %q: want a new one of %d bytes each time", v, len(taskSeq))
		}
		seen[v] = true
	}
	plain, _ := json.Marshal(loadPod())
	same := bodies(plain)
	if first, second := same(), same(); !bytes.Equal(first, plain) || !bytes.Equal(second, plain) {
		t.Error("a body without the task placeholder should be sent as it is")
	}
}

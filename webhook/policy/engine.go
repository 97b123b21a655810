package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/topdown"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runwarden/runwarden/internal/bufpool"
	"github.com/runwarden/runwarden/internal/contract"
)

// Query is the rule every policy set must define.
const Query = "data.runwarden.admission.decision"

// Errors a caller can check with errors.Is.
var (
	// ErrNoPolicies: the folder holds no .rego file.
	ErrNoPolicies = errors.New("no .rego files")
	// ErrCompile: a module does not parse or compile.
	ErrCompile = errors.New("policies do not compile")
	// ErrTestsFailed: the set's own tests fail.
	ErrTestsFailed = errors.New("policy tests fail")
	// ErrNoDecision: the policies define no decision for the input.
	ErrNoDecision = errors.New("the policies returned no decision")
	// ErrTimeout: an evaluation (a decision, the load's probe, one of the
	// set's tests) ran past its deadline, Options.Timeout.
	ErrTimeout = errors.New("policy evaluation ran past its deadline")
	// errDecisionShape: the decision is not of the Decision type's shape.
	errDecisionShape = errors.New("reading the decision")
)

// Set is a loaded, compiled and tested set of policies, ready to evaluate.
type Set struct {
	// Origin says where the set came from, for logs.
	Origin string
	// Digest identifies the set's content.
	Digest string
	// Tests is how many tests the set passed when loaded.
	Tests int
	// Files are the modules' file names, tests included.
	Files []string

	// Cached says whether decisions are cached (see the package doc).
	Cached bool
	// CacheOff says why they are not, nil when they are.
	CacheOff *CacheOff

	modules map[string]*ast.Module
	timeout time.Duration
	query   rego.PreparedEvalQuery
	reads   [][]string
	proj    *projection // reads, walked over the input's JSON
	cache   *decisionCache
	// inputs are buffers for the inputs' encodings, reused across Evals
	// (nil in a Set not made by Load: every Eval allocates its own).
	inputs *bufpool.Pool
}

// maxPooledInput bounds the buffers kept in Set.inputs: a rare huge pod's
// buffer is left to the garbage collector.
const maxPooledInput = 1 << 20

func (s *Set) inputBuf() *bytes.Buffer {
	if s.inputs == nil {
		return &bytes.Buffer{}
	}
	return s.inputs.Get()
}

func (s *Set) putInputBuf(b *bytes.Buffer) {
	if s.inputs != nil {
		s.inputs.Put(b)
	}
}

// DefaultTimeout bounds one evaluation when Options.Timeout is unset. It is
// well below the webhook configurations' timeoutSeconds (5 s), so a slow
// policy fails the admission call (which the API server retries) before the
// API server gives up on the webhook.
const DefaultTimeout = 2 * time.Second

// DefaultTestTimeout bounds each of a set's tests when Options.TestTimeout
// is unset. A test decides on many pods, and a set is loaded while the
// webhook starts or reloads, when its node may be busy: a healthy set must
// not be refused for being slow there, and a test that loops for ever is
// still stopped.
const DefaultTestTimeout = 30 * time.Second

// DefaultTestsTimeout bounds all of a set's tests together when
// Options.TestsTimeout is unset: the shipped set's tests take a few seconds
// on a busy node, and a set that takes minutes to load holds back a
// webhook's start and every reload behind it.
const DefaultTestsTimeout = 2 * time.Minute

// errTestsDeadline is the cause of the end of a set's tests at
// Options.TestsTimeout.
var errTestsDeadline = errors.New("the set's tests ran past their total deadline")

// Options configure how a set is loaded and evaluated. The server, its
// reloads and the offline `policy eval` and `policy test` all load with
// them, so a set behaves alike everywhere.
type Options struct {
	// Timeout bounds every decision of the set: the probe decision when it
	// loads, then each admission's. A decision past it is stopped and fails
	// with ErrTimeout. Default: DefaultTimeout.
	Timeout time.Duration
	// TestTimeout bounds each of the set's tests, alike: the first test
	// past it stops the rest, and the set is refused. Default:
	// DefaultTestTimeout.
	TestTimeout time.Duration
	// TestsTimeout bounds all of the set's tests together (with coverage,
	// both runs of TestWithCoverage): past it the tests stop and the set
	// is refused. Default: DefaultTestsTimeout.
	TestsTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.TestTimeout <= 0 {
		o.TestTimeout = DefaultTestTimeout
	}
	if o.TestsTimeout <= 0 {
		o.TestsTimeout = DefaultTestsTimeout
	}
}

// Load reads every .rego file under root of fsys, compiles them with the
// capabilities of Capabilities, runs their tests (files ending in
// _test.rego), and prepares the decision query. It refuses a set that does
// not compile, calls a built-in the capabilities leave out, fails its
// tests, or cannot decide on a plain runner pod within opts.Timeout.
func Load(ctx context.Context, fsys fs.FS, origin string, opts Options) (*Set, error) {
	opts.setDefaults()
	sources := map[string][]byte{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Kubernetes mounts ConfigMaps with ..data links and ..timestamp folders.
			if p != "." && strings.HasPrefix(d.Name(), "..") {
				return fs.SkipDir
			}
			return nil
		}
		if path.Ext(p) != ".rego" || strings.HasPrefix(d.Name(), "..") {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sources[p] = b
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading policies from %s: %w", origin, err)
	}
	if len(sources) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoPolicies, origin)
	}

	// A runner pod's input is a few KiB: a new buffer starts with room
	// for it rather than growing to it (and a garbage collection, which
	// empties the pool, costs one allocation, not several).
	s := &Set{Origin: origin, modules: map[string]*ast.Module{}, timeout: opts.Timeout,
		inputs: bufpool.New(4<<10, maxPooledInput)}
	h := sha256.New()
	for _, name := range sortedKeys(sources) {
		s.Files = append(s.Files, name)
		h.Write([]byte(name))
		h.Write(sources[name])
		m, err := ast.ParseModuleWithOpts(name, string(sources[name]), ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCompile, err)
		}
		s.modules[name] = m
	}
	s.Digest = fmt.Sprintf("%x", h.Sum(nil))[:12]

	compiler, err := compile(s.modules)
	if err != nil {
		return nil, err
	}
	if s.Tests, err = runTests(ctx, compiler, s.modules, nil, opts); err != nil {
		return nil, err
	}

	ropts := []func(*rego.Rego){rego.Query(Query), rego.Capabilities(Capabilities())}
	for _, name := range s.Files {
		if !strings.HasSuffix(name, "_test.rego") {
			ropts = append(ropts, rego.ParsedModule(s.modules[name]))
		}
	}
	s.query, err = rego.New(ropts...).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: preparing %s: %w", ErrCompile, Query, err)
	}
	// A set that compiles but decides nothing (a misspelt package, a
	// decision of the wrong shape) would refuse every pod: refuse it here,
	// so the set in force stays.
	if len(compiler.GetRulesExact(ast.MustParseRef(Query))) == 0 {
		return nil, fmt.Errorf("%w: the policies define no %s", ErrNoDecision, Query)
	}
	// A decision of the wrong shape shows on any pod; one that is undefined
	// or fails for this pod may still be right with the platform's
	// configuration, which the set is not loaded with.
	if v, err := toValue(probeInput()); err != nil {
		return nil, err
	} else if _, err := s.eval(ctx, v); errors.Is(err, errDecisionShape) {
		return nil, fmt.Errorf("%w: for a plain runner pod: %w", ErrCompile, err)
	} else if errors.Is(err, ErrTimeout) || ctx.Err() != nil {
		return nil, fmt.Errorf("deciding on a plain runner pod: %w", err)
	}
	s.reads, s.CacheOff = inputReads(s.modules)
	s.Cached = s.CacheOff == nil
	s.proj = newProjection(s.reads)
	s.cache = newDecisionCache(4096)
	return s, nil
}

// compile compiles the modules with the policies' capabilities; a call of
// a built-in they leave out is reported with its file and line.
func compile(modules map[string]*ast.Module) (*ast.Compiler, error) {
	compiler := ast.NewCompiler().WithEnablePrintStatements(false).WithCapabilities(Capabilities())
	if compiler.Compile(modules); compiler.Failed() {
		return nil, fmt.Errorf("%w: %w", ErrCompile, explainRefused(compiler.Errors))
	}
	return compiler, nil
}

// runTests runs the set's tests, each within opts.TestTimeout and all
// within opts.TestsTimeout; with a non-nil coverage tracer it records
// coverage too. The first test past a deadline stops the others: a set
// with one slow rule is slow in many of its tests, and each would
// otherwise wait out its own deadline. It returns how many tests ran (to
// their end, or to the stop).
func runTests(ctx context.Context, compiler *ast.Compiler, modules map[string]*ast.Module, cov *cover.Cover, opts Options) (int, error) {
	parent := ctx
	ctx, cancel := context.WithTimeoutCause(ctx, opts.TestsTimeout, errTestsDeadline)
	defer cancel()
	r := tester.NewRunner().SetCompiler(compiler).SetModules(modules).SetTimeout(opts.TestTimeout)
	if cov != nil {
		r = r.SetCoverageQueryTracer(cov)
	}
	ch, err := r.RunTests(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrTestsFailed, err)
	}
	n := 0
	var failed []string
	var late string
	for res := range ch {
		n++
		if late != "" {
			// Stopped: a test still sent was running beside the one
			// past its deadline (the runner runs a few at once), and
			// was cut short by the stop.
			continue
		}
		switch {
		case res.Error != nil && topdown.IsCancel(res.Error):
			at := fmt.Sprintf("%s.%s (%s:%d)", res.Package, res.Name, res.Location.File, res.Location.Row)
			if errors.Is(context.Cause(ctx), errTestsDeadline) {
				late = fmt.Sprintf("the set's tests ran past their total deadline of %s in %s, test %d; the rest were not run", opts.TestsTimeout, at, n)
			} else {
				late = fmt.Sprintf("%s ran past the deadline of %s; the rest were not run", at, opts.TestTimeout)
			}
			cancel()
		case res.Error != nil:
			failed = append(failed, fmt.Sprintf("%s.%s: %v", res.Package, res.Name, res.Error))
		case res.Fail:
			failed = append(failed, fmt.Sprintf("%s.%s (%s:%d)", res.Package, res.Name, res.Location.File, res.Location.Row))
		}
	}
	if err := parent.Err(); err != nil && !errors.Is(context.Cause(parent), errTestsDeadline) {
		return n, fmt.Errorf("%w: %w", ErrTestsFailed, err)
	}
	if late == "" && errors.Is(context.Cause(ctx), errTestsDeadline) {
		// The deadline passed between two tests: the rest never started.
		late = fmt.Sprintf("the set's tests ran past their total deadline of %s after test %d; the rest were not run", opts.TestsTimeout, n)
	}
	if late != "" {
		return n, fmt.Errorf("%w: %w: %s", ErrTestsFailed, ErrTimeout, strings.Join(append(failed, late), "; "))
	}
	if len(failed) > 0 {
		return n, fmt.Errorf("%w: %s", ErrTestsFailed, strings.Join(failed, "; "))
	}
	return n, nil
}

// TestReport is the result of TestWithCoverage.
type TestReport struct {
	Tests    int
	Coverage float64
	// Uncovered lists file:line ranges no test reached.
	Uncovered []string
	// CacheOff says why the set's decisions would not be cached, nil when
	// they would (Set.CacheOff).
	CacheOff *CacheOff
}

// TestWithCoverage loads the policies of fsys as the webhook does (Load,
// with the same capabilities and deadline) and runs their tests again with
// coverage, as `opa test --coverage` does.
func TestWithCoverage(ctx context.Context, fsys fs.FS, origin string, opts Options) (TestReport, error) {
	opts.setDefaults()
	// One deadline for both runs of the tests.
	ctx, cancel := context.WithTimeoutCause(ctx, opts.TestsTimeout, errTestsDeadline)
	defer cancel()
	s, err := Load(ctx, fsys, origin, opts)
	if err != nil {
		return TestReport{}, err
	}
	compiler, err := compile(s.modules)
	if err != nil {
		return TestReport{}, err
	}
	cov := cover.New()
	n, err := runTests(ctx, compiler, s.modules, cov, opts)
	if err != nil {
		return TestReport{}, err
	}
	rep := cov.Report(s.modules)
	out := TestReport{Tests: n, Coverage: rep.Coverage, CacheOff: s.CacheOff}
	seen := map[string]bool{}
	for _, f := range sortedKeys(rep.Files) {
		for _, r := range rep.Files[f].NotCovered {
			u := fmt.Sprintf("%s:%d-%d", f, r.Start.Row, r.End.Row)
			if !seen[u] {
				seen[u] = true
				out.Uncovered = append(out.Uncovered, u)
			}
		}
	}
	return out, nil
}

// Eval evaluates the decision for one input. Decisions are cached under
// the parts of the input the policies read (see the package doc); the returned
// decision may be shared, and must not be modified. Its violations and
// warnings never hold a value of the input's pod or old pod (see
// Redactor): what a policy quotes is replaced before any caller sees it.
func (s *Set) Eval(ctx context.Context, in *Input) (Decision, error) {
	d, _, err := s.EvalWithSource(ctx, in)
	return d, err
}

// Source says where a decision came from: the decision cache, or an
// evaluation of the policies.
type Source string

// The sources of a decision.
const (
	FromCache      Source = "cache"
	FromEvaluation Source = "evaluation"
)

// EvalWithSource is Eval, and says whether the decision came from the
// cache (the webhook counts both: runwarden_webhook_policy_decisions_total).
func (s *Set) EvalWithSource(ctx context.Context, in *Input) (Decision, Source, error) {
	buf := s.inputBuf()
	defer s.putInputBuf(buf)
	if err := appendInput(buf, in); err != nil {
		return Decision{}, FromEvaluation, fmt.Errorf("encoding the input: %w", err)
	}
	b := buf.Bytes()
	var k [32]byte
	if s.Cached {
		k = s.proj.key(b)
		if d, hit := s.cache.get(k); hit {
			return redactDecision(d, in), FromCache, nil
		}
	}
	v, err := valueOf(b)
	if err != nil {
		return Decision{}, FromEvaluation, err
	}
	d, err := s.eval(ctx, v)
	if err != nil {
		return Decision{}, FromEvaluation, err
	}
	if s.Cached {
		// Cached as the policies wrote it: another pod with the same key
		// has its own values to redact.
		s.cache.put(k, d)
	}
	return redactDecision(d, in), FromEvaluation, nil
}

// EvalUncached evaluates the decision without the cache, for tests and
// benchmarks that compare the two.
func (s *Set) EvalUncached(ctx context.Context, in *Input) (Decision, error) {
	buf := s.inputBuf()
	defer s.putInputBuf(buf)
	if err := appendInput(buf, in); err != nil {
		return Decision{}, fmt.Errorf("encoding the input: %w", err)
	}
	v, err := valueOf(buf.Bytes())
	if err != nil {
		return Decision{}, err
	}
	d, err := s.eval(ctx, v)
	if err != nil {
		return Decision{}, err
	}
	return redactDecision(d, in), nil
}

// eval evaluates the decision within the set's timeout. OPA's Eval cancels
// the evaluation (topdown.Cancel) when its context ends, so a slow rule
// stops at the deadline instead of holding the caller.
func (s *Set) eval(ctx context.Context, v ast.Value) (Decision, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout, ErrTimeout)
	defer cancel()
	rs, err := s.query.Eval(ctx, rego.EvalParsedInput(v))
	if err != nil {
		if topdown.IsCancel(err) && errors.Is(context.Cause(ctx), ErrTimeout) {
			return Decision{}, fmt.Errorf("%w: evaluating %s took longer than %s: a rule does too much work for one pod (a comprehension or numbers.range over a large set); make it cheaper, or raise the deadline", ErrTimeout, Query, s.timeout)
		}
		return Decision{}, fmt.Errorf("evaluating %s: %w", Query, err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return Decision{}, ErrNoDecision
	}
	if err := checkDecisionKeys(rs[0].Expressions[0].Value); err != nil {
		return Decision{}, fmt.Errorf("%w: %w", errDecisionShape, err)
	}
	b, err := json.Marshal(rs[0].Expressions[0].Value)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", errDecisionShape, err)
	}
	var d Decision
	if err := json.Unmarshal(b, &d); err != nil {
		return Decision{}, fmt.Errorf("%w: %w", errDecisionShape, err)
	}
	return d, nil
}

// checkDecisionKeys checks that the decision has deny and warnings lists
// and a mutations object, warn and dryrun lists if any, and no other key.
// json.Unmarshal reads a missing key as empty and skips an unknown one, so
// a misspelt deny ("denials") would admit every pod. warn and dryrun may be
// missing: a set written before actions has neither, and denies all it
// finds.
func checkDecisionKeys(v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return errors.New("the decision is not an object of deny, warn, dryrun, warnings and mutations")
	}
	for _, k := range []string{"deny", "warnings"} {
		if _, ok := m[k].([]any); !ok {
			return fmt.Errorf("the decision's %s is missing or not a list", k)
		}
	}
	for _, k := range []string{"warn", "dryrun"} {
		if _, ok := m[k].([]any); !ok && m[k] != nil {
			return fmt.Errorf("the decision's %s is not a list", k)
		}
	}
	if _, ok := m["mutations"].(map[string]any); !ok {
		return errors.New("the decision's mutations are missing or not an object")
	}
	var unknown []string
	for k := range m {
		switch k {
		case "deny", "warn", "dryrun", "warnings", "mutations":
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return fmt.Errorf("the decision has keys %q besides deny, warn, dryrun, warnings and mutations", unknown)
	}
	return nil
}

// toValue turns the input into OPA's value form through its JSON.
func toValue(in *Input) (ast.Value, error) {
	b, err := encodeInput(in)
	if err != nil {
		return nil, fmt.Errorf("encoding the input: %w", err)
	}
	return valueOf(b)
}

// valueOf is OPA's value form of an input's JSON encoding.
func valueOf(inputJSON []byte) (ast.Value, error) {
	v, err := ast.ValueFromReader(bytes.NewReader(inputJSON))
	if err != nil {
		return nil, fmt.Errorf("encoding the input: %w", err)
	}
	return v, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// probeInput is a plain runner pod, with no platform configuration, that
// a set must be able to decide on to be put in force.
func probeInput() *Input {
	return &Input{
		Operation: "CREATE",
		Runner:    true,
		Pod: &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "runners", Labels: map[string]string{contract.LabelRunner: "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "runner"}}, RestartPolicy: corev1.RestartPolicyNever},
		},
		Namespace:      NamespaceInfo{Name: "runners", Labels: map[string]string{}, Annotations: map[string]string{}},
		ServiceAccount: ObjectInfo{Name: "default", Annotations: map[string]string{}},
		Config:         map[string]any{},
		SecretRefs:     []SecretRef{},
	}
}

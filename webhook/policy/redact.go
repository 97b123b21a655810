package policy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/internal/contract"
)

// Redacted stands in a message for a value of the pod it quoted.
const Redacted = "[redacted]"

// What the Redactor treats as a value of a pod, and how long it must be.
// A rule's message names the rule, the container and the field path; a
// value it quotes (written so by a policy author, or by accident, through
// sprintf, json.marshal or a substring) is replaced before the message
// reaches a report, a log line, a metric label, a warning, a denial or the
// record the dispatcher copies to the orchestrator. Shorter values (a flag,
// a count, "true") are left: replacing them would garble every message and
// they are not secrets.
const (
	// minEnvValue is the shortest env value replaced (as before: env
	// values are where task authors put tokens).
	minEnvValue = 4
	// minValue is the shortest other value replaced: an argument, a
	// command word, a label's or annotation's value, a probe's command
	// or header, a part of one of those split at blanks and '='.
	minValue = 8
	// window is the length of the runs of a long value that are
	// replaced wherever a message holds one: a rule quoting part of a
	// token (substring, trim, split) is caught too.
	window = 16
)

// identityLabels are labels whose values are the pod's identity, written
// by runwarden's dispatcher or the Job controller (the chart's RBAC and the
// webhook's update guard keep others from changing them), and shown in a
// report's resource reference anyway: they are the pod's shape, not its
// values.
var identityLabels = []string{
	contract.LabelRunner, contract.TaskID, contract.LabelDispatcher,
	"job-name", "controller-uid", "batch.kubernetes.io/job-name", "batch.kubernetes.io/controller-uid",
	"batch.kubernetes.io/job-completion-index",
}

// recordAnnotations are the webhook's own record on a pod (names and
// digests, its warnings already redacted when written).
var recordAnnotations = []string{
	contract.AnnotationSpecDigest, contract.AnnotationPolicyDigest, contract.AnnotationMutations, contract.AnnotationWarnings,
}

// Redactor replaces in a text every value some pods carry, in every
// encoding a policy can write it in, and every URL's userinfo.
//
// The values: each container's (init, regular, ephemeral) env values
// (a whole secret reference excepted: it names a secret, never holds one),
// arguments and command words, its probes' and lifecycle hooks' commands
// and HTTP header values, and the pod's label and annotation values (those
// of its identity and the webhook's record excepted). An image reference
// is the pod's shape, not a value (it names what runs, and a registry
// takes no credentials in it); a URL's userinfo anywhere in a text is
// replaced, whoever wrote it.
//
// The encodings: as written; JSON-escaped (json.marshal, with and without
// HTML escaping); Go-quoted (sprintf's %q and %v of an array or object,
// which print strings with strconv.Quote; %+q's ASCII form); each of those
// twice (a quoted value inside a marshalled object); URL-encoded (query
// and path) and URL-decoded. A value of window or more bytes is also
// matched by any run of window bytes of it (the kubectl last-applied
// annotation excepted: it is the pod's JSON), and an env value, argument
// or command word by each part of it split at blanks and '='. An encoding a policy must choose to hide a value
// (base64, hex, reversing it, changing its case) is not matched: that is
// a policy author's deliberate leak, which review of the policies stops.
type Redactor struct {
	// needles are the values' encodings, longest first; written by
	// NewRedactor only.
	needles []string
	// windows are the window-byte runs of the long values' encodings;
	// written by NewRedactor only.
	windows map[string]struct{}
	// identity are the pod's identity (its name, namespace, owners, task):
	// a match that falls wholly inside one of them where a text names it
	// is the identity, not a value (a run of a long value that holds the
	// namespace, as a task ID does, would otherwise hide the namespace in
	// every message); written by NewRedactor only.
	identity []string
}

// NewRedactor returns a Redactor of the values pods carry (nil pods are
// skipped).
func NewRedactor(pods ...*corev1.Pod) *Redactor {
	return newRedactor("", pods...)
}

// newRedactor is NewRedactor for pods of namespace ns, which is their
// identity even where an admission request leaves it out of the pod.
func newRedactor(ns string, pods ...*corev1.Pod) *Redactor {
	c := collector{r: &Redactor{}, seen: map[string]bool{}, identity: map[string]bool{}}
	if ns != "" {
		c.identity[ns] = true
	}
	for _, p := range pods {
		if p != nil {
			c.identityOf(p)
		}
	}
	for _, p := range pods {
		if p != nil {
			c.pod(p)
		}
	}
	// Longest first: a value that holds another is replaced whole.
	slices.SortFunc(c.r.needles, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for v := range c.identity {
		if len(v) >= minEnvValue {
			c.r.identity = append(c.r.identity, v)
		}
	}
	slices.Sort(c.r.identity)
	return c.r
}

// collector gathers a Redactor's values.
type collector struct {
	r        *Redactor
	seen     map[string]bool
	identity map[string]bool
}

func (c *collector) identityOf(p *corev1.Pod) {
	for _, v := range []string{p.Name, p.GenerateName, p.Namespace} {
		c.identity[v] = true
	}
	for _, o := range p.OwnerReferences {
		c.identity[o.Name], c.identity[string(o.UID)] = true, true
	}
	for _, k := range identityLabels {
		if v, ok := p.Labels[k]; ok {
			c.identity[v] = true
		}
	}
	// The whole task ID, as the dispatcher wrote it on the Job's template.
	if v, ok := p.Annotations[contract.TaskID]; ok {
		c.identity[v] = true
	}
}

func (c *collector) pod(p *corev1.Pod) {
	for k, v := range p.Labels {
		if !slices.Contains(identityLabels, k) {
			c.value(v, minValue, false)
		}
	}
	for k, v := range p.Annotations {
		switch {
		case slices.Contains(recordAnnotations, k), k == contract.TaskID:
		case k == lastApplied:
			// The pod as kubectl applied it: its values are the pod's
			// own, found above; a run of its JSON would match any message
			// naming an image or a path the pod holds.
			c.whole(v, minValue)
		default:
			c.value(v, minValue, false)
		}
	}
	for i := range p.Spec.InitContainers {
		c.container(&p.Spec.InitContainers[i])
	}
	for i := range p.Spec.Containers {
		c.container(&p.Spec.Containers[i])
	}
	for i := range p.Spec.EphemeralContainers {
		ec := corev1.Container(p.Spec.EphemeralContainers[i].EphemeralContainerCommon)
		c.container(&ec)
	}
}

func (c *collector) container(ctr *corev1.Container) {
	for _, e := range ctr.Env {
		c.envValue(e.Value)
	}
	for _, list := range [][]string{ctr.Command, ctr.Args} {
		for _, v := range list {
			c.value(v, minValue, true)
		}
	}
	for _, h := range []*corev1.LifecycleHandler{lifecyclePostStart(ctr), lifecyclePreStop(ctr)} {
		if h != nil {
			c.handler(h.Exec, h.HTTPGet)
		}
	}
	for _, pr := range []*corev1.Probe{ctr.LivenessProbe, ctr.ReadinessProbe, ctr.StartupProbe} {
		if pr != nil {
			c.handler(pr.Exec, pr.HTTPGet)
		}
	}
}

func lifecyclePostStart(c *corev1.Container) *corev1.LifecycleHandler {
	if c.Lifecycle == nil {
		return nil
	}
	return c.Lifecycle.PostStart
}

func lifecyclePreStop(c *corev1.Container) *corev1.LifecycleHandler {
	if c.Lifecycle == nil {
		return nil
	}
	return c.Lifecycle.PreStop
}

func (c *collector) handler(exec *corev1.ExecAction, get *corev1.HTTPGetAction) {
	if exec != nil {
		for _, v := range exec.Command {
			c.value(v, minValue, true)
		}
	}
	if get != nil {
		for _, h := range get.HTTPHeaders {
			c.value(h.Value, minValue, true)
		}
		c.value(get.Path, minValue, true)
	}
}

// envValue adds an env value. The secret references in it, well formed or
// not, are not values: each names a secret (the policies' secret-ref
// rules quote them, a malformed one to say what is wrong with it); the
// text around them is. A reference without its closing brace runs into
// whatever follows it, so it is a value.
func (c *collector) envValue(v string) {
	var refs []SecretRef
	for _, ref := range ParseSecretRef("", "", v) {
		if strings.HasSuffix(ref.Raw, "}") {
			refs = append(refs, ref)
		}
	}
	if len(refs) == 0 {
		c.value(v, minEnvValue, true)
		return
	}
	if len(refs) == 1 && refs[0].Raw == v {
		return
	}
	c.whole(v, minEnvValue)
	rest := v
	for _, ref := range refs {
		before, after, _ := strings.Cut(rest, ref.Raw)
		c.value(before, minEnvValue, true)
		rest = after
	}
	c.value(rest, minEnvValue, true)
}

// lastApplied is the annotation kubectl apply keeps the applied object in.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// whole adds v (at least minLen bytes long, and not the pod's identity) in
// each encoding, and its URLs' userinfo.
func (c *collector) whole(v string, minLen int) {
	c.userinfo(v)
	if len(v) >= minLen && !c.identity[v] {
		c.add(v, false)
	}
}

// value adds v (at least minLen bytes long, and not the pod's identity) in
// each encoding and, when long, its windows; with task (an env value, an
// argument, a command word), also its parts split at blanks and '='. A
// URL's userinfo in it is added whatever its length.
func (c *collector) value(v string, minLen int, task bool) {
	c.userinfo(v)
	if len(v) < minLen || c.identity[v] {
		return
	}
	c.add(v, true)
	if !task {
		return
	}
	parts := strings.FieldsFunc(v, func(r rune) bool { return r == '=' || r == ' ' || r == '\t' || r == '\n' || r == '\r' })
	if len(parts) > 1 {
		for _, p := range parts {
			if len(p) >= minValue && !c.identity[p] {
				c.add(p, false)
			}
		}
	}
}

// userinfo adds the userinfo of each URL in v ("user:password", and each
// half of 4 bytes or more).
func (c *collector) userinfo(v string) {
	for _, span := range userinfoSpans(v) {
		ui := v[span[0]:span[1]]
		c.add(ui, false)
		if user, pass, ok := strings.Cut(ui, ":"); ok {
			for _, p := range []string{user, pass} {
				if len(p) >= minEnvValue {
					c.add(p, false)
				}
			}
		}
	}
}

func (c *collector) add(v string, windows bool) {
	for _, e := range encodings(v) {
		if !c.seen[e] {
			c.seen[e] = true
			c.r.needles = append(c.r.needles, e)
		}
		if windows && len(e) >= window {
			if c.r.windows == nil {
				c.r.windows = map[string]struct{}{}
			}
			for i := 0; i+window <= len(e); i++ {
				c.r.windows[e[i:i+window]] = struct{}{}
			}
		}
	}
}

// encodings are v as written and as a policy can write it (see Redactor).
func encodings(v string) []string {
	out := []string{v}
	add := func(e string) {
		if e != "" && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	if needsEscaping(v) {
		for _, enc := range []func(string) string{jsonHTMLBody, jsonBody, quoteBody, asciiQuoteBody} {
			once := enc(v)
			add(once)
			add(enc(once))
		}
	}
	add(url.QueryEscape(v))
	add(url.PathEscape(v))
	if strings.Contains(v, "%") {
		if u, err := url.QueryUnescape(v); err == nil {
			add(u)
		}
		if u, err := url.PathUnescape(v); err == nil {
			add(u)
		}
	}
	return out
}

// needsEscaping tells whether any quoting changes v.
func needsEscaping(v string) bool {
	for i := 0; i < len(v); i++ {
		switch b := v[i]; {
		case b < 0x20, b >= 0x7f, b == '"', b == '\\', b == '<', b == '>', b == '&':
			return true
		}
	}
	return false
}

func jsonHTMLBody(v string) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b[1 : len(b)-1])
}

func jsonBody(v string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	return string(b[1 : len(b)-1])
}

func quoteBody(v string) string {
	q := strconv.Quote(v)
	return q[1 : len(q)-1]
}

func asciiQuoteBody(v string) string {
	q := strconv.QuoteToASCII(v)
	return q[1 : len(q)-1]
}

// userinfoSpans are the byte ranges of the userinfo of each URL in s
// ("scheme://userinfo@host...").
func userinfoSpans(s string) [][2]int {
	var spans [][2]int
	for off := 0; ; {
		i := strings.Index(s[off:], "://")
		if i < 0 {
			return spans
		}
		start := off + i + len("://")
		end := start
		for end < len(s) && !strings.ContainsRune("/?#@ \t\r\n\"'\\<>`", rune(s[end])) {
			end++
		}
		if end < len(s) && s[end] == '@' && end > start {
			spans = append(spans, [2]int{start, end})
		}
		off = start
	}
}

// Redact returns s with every value of the Redactor's pods, in each
// encoding, and every URL's userinfo replaced by Redacted.
func (r *Redactor) Redact(s string) string {
	if s == "" {
		return s
	}
	var mark []bool
	// kept are where s names the pod's identity.
	var kept [][2]int
	for _, id := range r.identity {
		for off := 0; off < len(s); {
			i := strings.Index(s[off:], id)
			if i < 0 {
				break
			}
			kept = append(kept, [2]int{off + i, off + i + len(id)})
			off += i + 1
		}
	}
	set := func(from, to int) {
		for _, k := range kept {
			if k[0] <= from && to <= k[1] {
				return
			}
		}
		if mark == nil {
			mark = make([]bool, len(s))
		}
		for i := from; i < to; i++ {
			mark[i] = true
		}
	}
	for _, n := range r.needles {
		for off := 0; off < len(s); {
			i := strings.Index(s[off:], n)
			if i < 0 {
				break
			}
			set(off+i, off+i+len(n))
			off += i + 1
		}
	}
	for i := 0; i+window <= len(s) && len(r.windows) > 0; i++ {
		if _, ok := r.windows[s[i:i+window]]; ok {
			set(i, i+window)
		}
	}
	for _, span := range userinfoSpans(s) {
		set(span[0], span[1])
	}
	if mark == nil {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if !mark[i] {
			b.WriteByte(s[i])
			i++
			continue
		}
		b.WriteString(Redacted)
		for i < len(s) && mark[i] {
			i++
		}
	}
	out := b.String()
	if !utf8.ValidString(out) {
		// A window may start or end inside a character.
		out = strings.ToValidUTF8(out, "")
	}
	return out
}

// redactDecision is d with the text of its violations and warnings
// redacted against the input's pods (see Redactor): every Decision the Set
// returns has been through it, so neither the webhook (its denials,
// warnings, record, log lines and metric labels) nor the audit (its
// reports) can pass on a value a policy quoted. d is returned as it is
// when nothing in it changes (it may be the cache's); otherwise a copy.
func redactDecision(d Decision, in *Input) Decision {
	if len(d.Deny) == 0 && len(d.Warn) == 0 && len(d.Dryrun) == 0 && len(d.Warnings) == 0 {
		return d
	}
	r := newRedactor(in.Namespace.Name, in.Pod, in.OldPod)
	out := d
	out.Deny = redactViolations(r, d.Deny)
	out.Warn = redactViolations(r, d.Warn)
	out.Dryrun = redactViolations(r, d.Dryrun)
	out.Warnings = redactStrings(r, d.Warnings)
	return out
}

// redactViolations is vs, or a redacted copy when anything in it changes.
func redactViolations(r *Redactor, vs []Violation) []Violation {
	var out []Violation
	for i, v := range vs {
		w := Violation{Rule: r.Redact(v.Rule), Container: r.Redact(v.Container), Field: r.Redact(v.Field), Message: r.Redact(v.Message), Action: v.Action}
		if out == nil && w == v {
			continue
		}
		if out == nil {
			out = slices.Clone(vs[:i:i])
		}
		out = append(out, w)
	}
	if out == nil {
		return vs
	}
	return out
}

// redactStrings is ss, or a redacted copy when any changes.
func redactStrings(r *Redactor, ss []string) []string {
	var out []string
	for i, s := range ss {
		w := r.Redact(s)
		if out == nil && w == s {
			continue
		}
		if out == nil {
			out = slices.Clone(ss[:i:i])
		}
		out = append(out, w)
	}
	if out == nil {
		return ss
	}
	return out
}

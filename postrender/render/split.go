package render

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// ErrEmptyInput is returned when the input holds no document: Helm rendered
// nothing, or the post-renderer was run without piping manifests in.
var ErrEmptyInput = errors.New("no manifests on standard input")

// DocumentError says which input document could not be read.
type DocumentError struct {
	// Index is the document's position in the stream, from 1.
	Index int
	// Line is the line of the input the document starts on, from 1.
	Line int
	// Source is the template Helm rendered it from, when the document says.
	Source string
	Err    error
}

func (e *DocumentError) Error() string {
	where := fmt.Sprintf("document %d (input line %d", e.Index, e.Line)
	if e.Source != "" {
		where += ", " + e.Source
	}
	return where + "): " + e.Err.Error()
}

func (e *DocumentError) Unwrap() error { return e.Err }

// doc is one YAML document of the input.
type doc struct {
	index int    // position in the stream, from 1
	line  int    // first input line of the document, from 1
	raw   []byte // the document's text, without the separator
	node  *yaml.RNode
	kind  string
	name  string
	hook  bool // carries the helm.sh/hook annotation
	list  bool // a List whose items Kustomize reads as resources
	empty bool // null, {} or []: dropped, as Kustomize drops them
}

// splitDocuments cuts a YAML stream at its "---" separators, keeping each
// document's text and first line. As in `kustomize build`, a separator is a
// line that starts with "---"; anything after it but blanks and a comment is
// an error, except on the first line, where YAML reads it as the first
// document's content. In YAML a separator ends the document even inside a
// block scalar, whose lines are always indented. Documents that hold only
// comments and blank lines are dropped, as Helm does.
func splitDocuments(input []byte) ([]doc, error) {
	var docs []doc
	start, startLine, line := 0, 1, 1
	flush := func(end int) {
		raw := input[start:end]
		if hasContent(raw) {
			docs = append(docs, doc{index: len(docs) + 1, line: startLine, raw: raw})
		}
	}
	for i := 0; i < len(input); {
		nl := bytes.IndexByte(input[i:], '\n')
		next := len(input)
		if nl >= 0 {
			next = i + nl + 1
		}
		if l := input[i:next]; bytes.HasPrefix(l, []byte("---")) {
			rest := bytes.TrimSpace(l[3:])
			switch {
			case len(rest) == 0 || rest[0] == '#':
				flush(i)
				start, startLine = next, line+1
			case i > 0:
				// The line would start the next document.
				index := len(docs) + 1
				if hasContent(input[start:i]) {
					index++
				}
				return nil, &DocumentError{Index: index, Line: line,
					Err: fmt.Errorf("invalid document separator: %s", bytes.TrimSpace(l))}
			}
		}
		i = next
		line++
	}
	flush(len(input))
	return docs, nil
}

func hasContent(raw []byte) bool {
	for _, l := range bytes.Split(raw, []byte("\n")) {
		t := bytes.TrimSpace(l)
		if len(t) > 0 && t[0] != '#' {
			return true
		}
	}
	return false
}

// parse reads the document into a node and its identity.
func (d *doc) parse() error {
	node, err := yaml.Parse(string(d.raw))
	if err != nil {
		return d.errorf("%w", err)
	}
	if node.IsNilOrEmpty() {
		// null, {}, []: Kustomize drops such documents.
		d.empty = true
		return nil
	}
	if node.YNode().Kind != yaml.MappingNode {
		return d.errorf("a manifest must be a mapping, found %s", kindName(node.YNode().Kind))
	}
	if bytes.IndexByte(d.raw, '*') >= 0 {
		if a := aliasCycle(node.YNode()); a != nil {
			// Kustomize would expand it for ever (a stack overflow).
			return d.errorf("alias *%s on input line %d is inside the anchor it refers to", a.Value, d.line+a.Line-1)
		}
		// Kustomize expands every alias into a copy: a few hundred bytes
		// of aliases of aliases would take all memory.
		if err := checkAliasing(node.YNode()); err != nil {
			return d.errorf("%w", err)
		}
	}
	d.node = node
	meta, err := node.GetMeta()
	if err != nil {
		return d.errorf("reading metadata: %w", err)
	}
	if meta.Kind == "" {
		return d.errorf("the manifest has no kind")
	}
	d.kind, d.name = meta.Kind, meta.Name
	// Kustomize reads a List's items as resources of their own.
	d.list = strings.HasSuffix(d.kind, "List") && node.Field("items") != nil
	_, d.hook = meta.Annotations[helmHookAnnotation]
	return nil
}

// aliasCycle returns an alias inside the node its anchor names, if n holds
// one. YAML defines an anchor before its aliases, so an alias can only lead
// back to a node still open around it: one of its ancestors.
func aliasCycle(n *yaml.Node) *yaml.Node {
	var open []*yaml.Node
	var walk func(n *yaml.Node) *yaml.Node
	walk = func(n *yaml.Node) *yaml.Node {
		if n.Kind == yaml.AliasNode {
			if slices.Contains(open, n.Alias) {
				return n
			}
			return nil
		}
		open = append(open, n)
		defer func() { open = open[:len(open)-1] }()
		for _, c := range n.Content {
			if a := walk(c); a != nil {
				return a
			}
		}
		return nil
	}
	return walk(n)
}

// Bounds on what aliases may add to a document, as the YAML decoder the
// Kubernetes API server uses bounds them: no bound up to maxAliasFree
// nodes, then aliases may make up at most a share of the expanded document
// that falls from 99% at 400,000 nodes to 10% at 4,000,000, and never more
// than maxExpandedNodes in all.
const (
	maxAliasFree     = 1000
	maxExpandedNodes = 4_000_000
	// maxAliasedBytes bounds the bytes of values aliases copy in one
	// document.
	maxAliasedBytes = 16 << 20
)

// ErrExcessiveAliasing is a document whose aliases expand it past the
// bounds above.
var ErrExcessiveAliasing = errors.New("excessive aliasing")

// checkAliasing refuses a document whose aliases would expand it beyond the
// bounds, without expanding it: each node's expanded size is counted once.
func checkAliasing(root *yaml.Node) error {
	type size struct{ nodes, bytes int }
	sizes := map[*yaml.Node]size{}
	literal := size{}
	var measure func(n *yaml.Node) size
	measure = func(n *yaml.Node) size {
		if n.Kind == yaml.AliasNode {
			return measure(n.Alias)
		}
		if s, ok := sizes[n]; ok {
			return s
		}
		literal.nodes++
		literal.bytes += len(n.Value)
		s := size{nodes: 1, bytes: len(n.Value)}
		for _, c := range n.Content {
			cs := measure(c)
			s.nodes = min(s.nodes+cs.nodes, maxExpandedNodes+1)
			s.bytes = min(s.bytes+cs.bytes, maxAliasedBytes+literal.bytes+1)
		}
		sizes[n] = s
		return s
	}
	all := measure(root)
	expanded := all.nodes
	aliased := expanded - literal.nodes
	if expanded > maxAliasFree && aliased > 100 && (expanded > maxExpandedNodes || float64(aliased)/float64(expanded) > allowedAliasShare(expanded)) {
		into := fmt.Sprint(expanded)
		if expanded > maxExpandedNodes {
			into = fmt.Sprintf("more than %d", maxExpandedNodes)
		}
		return fmt.Errorf("%w: its aliases expand %d nodes into %s, %d%% of them copies (a document may have %d nodes at most, and the larger it is, the smaller the share aliases may make up); write the repeated parts out, or use fewer aliases of aliases",
			ErrExcessiveAliasing, literal.nodes, into, aliased*100/expanded, maxExpandedNodes)
	}
	// A long value aliased many times takes few nodes and much memory.
	if all.bytes-literal.bytes > maxAliasedBytes {
		return fmt.Errorf("%w: its aliases copy more than %d bytes of values (at most %d MiB); write the repeated parts out, or use fewer aliases of long values",
			ErrExcessiveAliasing, maxAliasedBytes, maxAliasedBytes>>20)
	}
	return nil
}

// allowedAliasShare is the share of an expanded document of n nodes that
// aliases may make up.
func allowedAliasShare(n int) float64 {
	switch {
	case n <= 400_000:
		return 0.99
	case n >= maxExpandedNodes:
		return 0.10
	default:
		return 0.10 + 0.89*float64(maxExpandedNodes-n)/float64(maxExpandedNodes-400_000)
	}
}

func (d *doc) errorf(format string, args ...any) error {
	return &DocumentError{Index: d.index, Line: d.line, Source: helmSource(d.raw), Err: fmt.Errorf(format, args...)}
}

// helmSource returns the template named by Helm's "# Source:" comment.
func helmSource(raw []byte) string {
	for _, l := range strings.SplitN(string(raw), "\n", 4) {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "# Source: "); ok {
			return s
		}
	}
	return ""
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return "a plain value"
	case yaml.AliasNode:
		return "an alias"
	default:
		return "something else"
	}
}

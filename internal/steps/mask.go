package steps

import (
	"bytes"
	"io"
	"slices"
	"strings"
)

// Masked is what a secret's value is written as in the job's log.
const Masked = "***"

// minMask is the shortest value masked: a shorter one ("1", "on") would
// mask the log rather than the secret.
const minMask = 4

// addMaskCommand is the workflow command that masks a value of the
// step's own from then on, as in GitHub's and Gitea's runners.
const addMaskCommand = "::add-mask::"

// maxPending is the most of an unended line held back for masking; past
// it the line is written as it is so far (masked).
const maxPending = 64 << 10

// masker writes the job's log with every value to mask replaced by
// Masked: the job's secrets, the resolved values of its container.env
// secret references, and what the steps mask with ::add-mask::. It works
// line by line, so a value split across writes is still found; a line is
// written once it ends (or past maxPending). Masking keeps a secret out
// of the log by accident, as Gitea's runner does; a step that means to
// print one can (encoded, say), since it runs with the secret.
type masker struct {
	out     io.Writer
	masks   []string
	pending []byte
}

func newMasker(out io.Writer) *masker { return &masker{out: out} }

// add masks value from now on: each of its lines of at least minMask
// bytes.
func (m *masker) add(value string) {
	for _, v := range strings.Split(value, "\n") {
		v = strings.TrimSuffix(v, "\r")
		if len(v) < minMask || slices.Contains(m.masks, v) {
			continue
		}
		m.masks = append(m.masks, v)
	}
	// The longest first, so a value holding another is masked whole.
	slices.SortFunc(m.masks, func(a, b string) int { return len(b) - len(a) })
}

// mask is s with every value masked.
func (m *masker) mask(s string) string {
	for _, v := range m.masks {
		// No copy when v is not there.
		s = strings.ReplaceAll(s, v, Masked)
	}
	return s
}

// holds tells whether s holds a value masked.
func (m *masker) holds(s string) bool {
	for _, v := range m.masks {
		if strings.Contains(s, v) {
			return true
		}
	}
	return false
}

func (m *masker) Write(p []byte) (int, error) {
	m.pending = append(m.pending, p...)
	for {
		i := bytes.IndexByte(m.pending, '\n')
		if i < 0 {
			break
		}
		if err := m.line(string(m.pending[:i+1])); err != nil {
			return len(p), err
		}
		m.pending = m.pending[i+1:]
	}
	if len(m.pending) > maxPending {
		return len(p), m.Flush()
	}
	if len(m.pending) == 0 {
		m.pending = nil
	}
	return len(p), nil
}

// line writes one line, ended by its newline, masked; an ::add-mask::
// command masks its value first.
func (m *masker) line(l string) error {
	if v, ok := strings.CutPrefix(strings.TrimRight(l, "\r\n"), addMaskCommand); ok {
		m.add(strings.TrimSpace(v))
	}
	_, err := io.WriteString(m.out, m.mask(l))
	return err
}

// Flush writes what is held of an unended line.
func (m *masker) Flush() error {
	if len(m.pending) == 0 {
		return nil
	}
	s := string(m.pending)
	m.pending = nil
	_, err := io.WriteString(m.out, m.mask(s))
	return err
}

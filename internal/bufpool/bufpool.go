// Package bufpool keeps byte buffers for reuse on a hot path (an
// admission's input encoding, its patch), so that each use does not grow a
// buffer of its own; a buffer grown past a bound is left to the garbage
// collector rather than kept.
package bufpool

import (
	"bytes"
	"sync"
)

// Pool is a sync.Pool of *bytes.Buffer. The zero Pool is not usable: make
// one with New.
type Pool struct {
	max  int
	pool sync.Pool
}

// New returns a Pool whose new buffers start with room for initial bytes
// and which keeps no buffer grown past max.
func New(initial, max int) *Pool {
	p := &Pool{max: max}
	p.pool.New = func() any { return bytes.NewBuffer(make([]byte, 0, initial)) }
	return p
}

// Get returns an empty buffer.
func (p *Pool) Get() *bytes.Buffer { return p.pool.Get().(*bytes.Buffer) }

// Put gives b back, emptied, unless it has grown past the Pool's bound. b
// and anything still holding its bytes must not be used afterwards.
func (p *Pool) Put(b *bytes.Buffer) {
	if b.Cap() > p.max {
		return
	}
	b.Reset()
	p.pool.Put(b)
}

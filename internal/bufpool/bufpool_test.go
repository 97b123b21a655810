package bufpool

import "testing"

func TestPool(t *testing.T) {
	p := New(64, 1024)
	b := p.Get()
	if b.Len() != 0 || b.Cap() < 64 {
		t.Fatalf("a new buffer: len %d, cap %d; want empty with room for 64", b.Len(), b.Cap())
	}
	b.WriteString("left over")
	p.Put(b)
	if got := p.Get(); got.Len() != 0 {
		t.Errorf("a buffer from the pool holds %q", got.String())
	}
	big := p.Get()
	big.Grow(4096)
	big.WriteString("x")
	p.Put(big) // past the bound: not kept
	for range 10 {
		if got := p.Get(); got.Cap() > 1024 {
			t.Fatalf("the pool kept a buffer of %d bytes, past its bound of 1024", got.Cap())
		}
	}
}

package policy

import (
	"crypto/sha256"
	"encoding/json"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
)

// projection is the input paths the policies read, as a tree of keys,
// walked once over the input's JSON. A path ends in a node read whole (no
// path is below another, see coveringPaths); elementKey in a path goes on
// in every element of the list there, and countKey reads its number of
// elements.
type projection struct {
	root *projectionNode
}

type projectionNode struct {
	whole    bool            // a path ends here: the value whole
	exists   bool            // whether the value is there (existsKey)
	count    bool            // the number of elements (countKey)
	elem     *projectionNode // what of each element (elementKey)
	keys     []string        // the fields below, in the order the paths were found (a key is only compared within its Set)
	children []*projectionNode
	index    map[string]int // keys[i] -> i
}

func newProjection(paths [][]string) *projection {
	p := &projection{root: &projectionNode{}}
	for _, keys := range paths {
		n := p.root
		for i, k := range keys {
			last := i == len(keys)-1
			switch {
			case k == countKey && last:
				n.count = true
				continue
			case k == existsKey && last:
				n.exists = true
				continue
			case k == elementKey:
				if n.elem == nil {
					n.elem = &projectionNode{}
				}
				n = n.elem
			default:
				j, ok := n.index[k]
				if !ok {
					if n.index == nil {
						n.index = map[string]int{}
					}
					j = len(n.keys)
					n.index[k] = j
					n.keys = append(n.keys, k)
					n.children = append(n.children, &projectionNode{})
				}
				n = n.children[j]
			}
			if last {
				n.whole = true
			}
		}
	}
	return p
}

// field is the index of key among n's fields, or -1: a scan of the
// keys when they are few (most nodes read one to eight), cheaper
// than hashing the key for the map.
func (n *projectionNode) field(key string) int {
	if len(n.keys) > 8 {
		if i, ok := n.index[key]; ok {
			return i
		}
		return -1
	}
	for i, k := range n.keys {
		if k == key {
			return i
		}
	}
	return -1
}

// key hashes what the paths read of the input's JSON. encoding/json
// writes struct fields in a fixed order and map keys sorted, so equal
// values give equal bytes; a missing value hashes differently from any
// present one.
func (p *projection) key(inputJSON []byte) [32]byte {
	// Read in place: the Results point into inputJSON, which is neither
	// kept nor changed before key returns. What is hashed is gathered
	// first: sha256.Sum256 of one slice costs no allocation, where a
	// hash.Hash and its Writes of strings each do.
	r := gjson.Parse(unsafe.String(unsafe.SliceData(inputJSON), len(inputJSON)))
	return sha256.Sum256(p.root.appendTo(make([]byte, 0, 2048), r))
}

// appendTo appends to b what n reads of r: r whole, or its number of
// elements, each element as n.elem reads it, and each field as its node
// reads it (the last of duplicate keys, as OPA's decoding of the input
// keeps: encoding/json writes two map keys that differ only in invalid
// UTF-8 as the same key). A
// missing value reads as such (its fields as missing ones); a value not of
// the kind n expects (an object where a list was read, a string where
// fields were) is taken whole. Markers and
// terminators are bytes no JSON text holds (control characters are escaped
// in it, and 0xfb-0xff are not UTF-8), and every part ends in a
// terminator, so distinct projections never give the same bytes.
func (n *projectionNode) appendTo(b []byte, r gjson.Result) []byte {
	if n.whole {
		if !r.Exists() {
			return append(b, 0)
		}
		return append(append(b, 1), r.Raw...)
	}
	if n.exists {
		if r.Exists() {
			b = append(b, 9)
		} else {
			b = append(b, 0)
		}
		b = append(b, 0xfa)
	}
	// With each element read, their number is read with them.
	if n.count && n.elem == nil {
		switch {
		case !r.Exists():
			b = append(b, 0)
		case r.IsArray():
			count := 0
			r.ForEach(func(_, _ gjson.Result) bool {
				count++
				return true
			})
			b = strconv.AppendInt(append(b, 5), int64(count), 10)
		default:
			b = append(append(b, 2), r.Raw...)
		}
		b = append(b, 0xfc)
	}
	if n.elem != nil {
		switch {
		case !r.Exists():
			b = append(b, 0)
		case r.IsArray():
			b = append(b, 3)
			r.ForEach(func(_, v gjson.Result) bool {
				b = append(n.elem.appendTo(b, v), 0xfe)
				return true
			})
		default:
			b = append(append(b, 2), r.Raw...)
		}
		b = append(b, 0xfd)
	}
	if len(n.keys) == 0 {
		return b
	}
	var small [16]gjson.Result
	vals := small[:0]
	if len(n.keys) > len(small) {
		vals = make([]gjson.Result, len(n.keys))
	}
	vals = vals[:len(n.keys)]
	switch {
	case r.IsObject():
		r.ForEach(func(k, v gjson.Result) bool {
			if i := n.field(objectKey(k)); i >= 0 {
				vals[i] = v // the last of duplicate keys, as OPA decodes the input
			}
			return true
		})
	case r.Exists():
		// Not an object: taken whole (object.get of one is an error, where
		// that of an object without the field is its default).
		return append(append(b, 7), r.Raw...)
	}
	for i, c := range n.children {
		b = append(c.appendTo(b, vals[i]), 0xfb)
	}
	return b
}

// objectKey is an object's key as OPA reads it: decoded by encoding/json,
// which makes each invalid UTF-8 byte and each lone surrogate escape
// U+FFFD, where gjson keeps the bytes or reads two escapes as one. Keys
// in plain ASCII without escapes, nearly all, are the same either way.
func objectKey(k gjson.Result) string {
	for i := range len(k.Raw) {
		if c := k.Raw[i]; c == '\\' || c >= utf8.RuneSelf {
			var s string
			if json.Unmarshal([]byte(k.Raw), &s) == nil {
				return s
			}
			break
		}
	}
	return k.Str
}

// decisionCache is a bounded map from input projections to decisions.
type decisionCache struct {
	mu  sync.Mutex
	m   map[[32]byte]Decision
	max int
}

func newDecisionCache(max int) *decisionCache {
	return &decisionCache{m: make(map[[32]byte]Decision), max: max}
}

func (c *decisionCache) get(k [32]byte) (Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[k]
	return d, ok
}

func (c *decisionCache) put(k [32]byte, d Decision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		clear(c.m) // rare: the platform template changed often; start over
	}
	c.m[k] = d
}

package flowcontrol

import (
	"cmp"
	"testing"

	"github.com/emirpasic/gods/v2/trees/redblacktree"
	"pgregory.net/rapid"
)

// vtKey is a flow's fair-share key in the model.
type vtKey struct {
	start float64
	order uint64
}

// TestVTHeapModel drives a vtHeap and a gods red-black tree ordered on
// (start, order) — the model — with the same pushes, removals, key changes
// (up and down, ties included) and pops of the top: the top is always the
// model's smallest, and every flow's vtIdx is its place in the heap.
func TestVTHeapModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var h vtHeap[int]
		model := redblacktree.NewWith[vtKey, *flow[int]](func(a, b vtKey) int {
			return cmp.Or(cmp.Compare(a.start, b.start), cmp.Compare(a.order, b.order))
		})
		flows := make([]*flow[int], rapid.IntRange(1, 80).Draw(t, "flows"))
		for i := range flows {
			flows[i] = &flow[int]{vtIdx: -1}
		}
		var order uint64
		// Few distinct start tags, so that ties (broken by order) are common.
		start := func(t *rapid.T) float64 { return float64(rapid.IntRange(0, 12).Draw(t, "start")) / 2 }
		pick := func(t *rapid.T, in bool) *flow[int] {
			var c []*flow[int]
			for _, f := range flows {
				if (f.vtIdx >= 0) == in {
					c = append(c, f)
				}
			}
			if len(c) == 0 {
				t.Skip("none")
			}
			return rapid.SampledFrom(c).Draw(t, "flow")
		}
		key := func(f *flow[int]) vtKey { return vtKey{f.start, f.order} }
		t.Repeat(map[string]func(*rapid.T){
			"push": func(t *rapid.T) {
				f := pick(t, false)
				f.start, f.order = start(t), order
				order++
				h.push(f)
				model.Put(key(f), f)
			},
			"pushMany": func(t *rapid.T) {
				// Bursts of activations, as a busy tick has: the heap
				// gets deep enough for every sift path within a few
				// steps.
				for range rapid.IntRange(1, 24).Draw(t, "n") {
					f := pick(t, false)
					f.start, f.order = start(t), order
					order++
					h.push(f)
					model.Put(key(f), f)
				}
			},
			"remove": func(t *rapid.T) {
				f := pick(t, true)
				model.Remove(key(f))
				h.remove(f)
				h.remove(f) // a flow not there: nothing
			},
			"fix": func(t *rapid.T) {
				f := pick(t, true)
				model.Remove(key(f))
				f.start = start(t)
				h.fix(f)
				model.Put(key(f), f)
			},
			"popTop": func(t *rapid.T) {
				if h.len() == 0 {
					t.Skip("empty")
				}
				f := h.top()
				if want := model.Left().Value; f != want {
					t.Fatalf("top %v, model %v", key(f), key(want))
				}
				model.Remove(key(f))
				h.remove(f)
			},
			"clear": func(t *rapid.T) {
				if rapid.IntRange(0, 9).Draw(t, "rarely") == 0 {
					h.clear()
					model.Clear()
				}
			},
			"": func(t *rapid.T) {
				if h.len() != model.Size() {
					t.Fatalf("%d in the heap, model %d", h.len(), model.Size())
				}
				if h.len() > 0 && h.top() != model.Left().Value {
					t.Fatalf("top %v, model %v", key(h.top()), key(model.Left().Value))
				}
				for i := range h.h {
					it := &h.h[i]
					if int(it.f.vtIdx) != i || it.start != it.f.start || it.order != it.f.order {
						t.Fatalf("slot %d: vtIdx %d, key %v, flow key %v", i, it.f.vtIdx, vtKey{it.start, it.order}, key(it.f))
					}
					if i > 0 && it.less(&h.h[(i-1)/4]) {
						t.Fatalf("slot %d is less than its parent", i)
					}
				}
				in := 0
				for _, f := range flows {
					if f.vtIdx >= 0 {
						in++
					}
				}
				if in != h.len() {
					t.Fatalf("%d flows think they are in a heap of %d", in, h.len())
				}
			},
		})
	})
}

package flowcontrol

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/emirpasic/gods/v2/maps/hashmap"
	"pgregory.net/rapid"
)

// TestFlowIndexModel drives a flowIndex and a gods hashmap (the model) with
// the same adds, removes and lookups, over enough ids that the table grows,
// fills with tombstones and shrinks: every lookup and every walk agrees with
// the model.
func TestFlowIndexModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var ix flowIndex[int]
		ix.init()
		model := hashmap.New[string, *flow[int]]()
		nids := rapid.IntRange(1, 300).Draw(t, "ids")
		id := func(t *rapid.T) string { return fmt.Sprint("f", rapid.IntRange(0, nids-1).Draw(t, "id")) }
		check := func(t *rapid.T, id string) {
			want, _ := model.Get(id)
			if got := ix.get(id, ix.hash(id)); got != want {
				t.Fatalf("get(%q) = %p, model %p", id, got, want)
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"add": func(t *rapid.T) {
				id := id(t)
				made := false
				f := ix.getOrAdd(id, ix.hash(id), func() *flow[int] { made = true; return &flow[int]{id: id} })
				if old, ok := model.Get(id); ok {
					if made || f != old {
						t.Fatalf("getOrAdd(%q) made %v, returned %p, model %p", id, made, f, old)
					}
				} else {
					if !made {
						t.Fatalf("getOrAdd(%q) of an absent id made nothing", id)
					}
					model.Put(id, f)
				}
			},
			"addMany": func(t *rapid.T) {
				// Bursts of adds make the table grow past several sizes.
				for range rapid.IntRange(1, 64).Draw(t, "n") {
					id := id(t)
					f := ix.getOrAdd(id, ix.hash(id), func() *flow[int] { return &flow[int]{id: id} })
					model.Put(id, f)
				}
			},
			"remove": func(t *rapid.T) {
				id := id(t)
				if f, ok := model.Get(id); ok {
					ix.remove(f)
					ix.remove(f) // idempotent
					model.Remove(id)
				}
			},
			"removeStale": func(t *rapid.T) {
				// A flow that is not (or no longer) in the index: nothing
				// changes, even when an equal id is there.
				id := id(t)
				ix.remove(&flow[int]{id: id})
			},
			"get": func(t *rapid.T) { check(t, id(t)) },
			"": func(t *rapid.T) {
				var got []string
				ix.each(func(f *flow[int]) { got = append(got, f.id) })
				want := model.Keys()
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("each: %v, model %v", got, want)
				}
				if ix.live != model.Size() {
					t.Fatalf("live %d, model %d", ix.live, model.Size())
				}
				if tab := ix.tab.Load(); 4*ix.used > 3*len(tab.slots) || len(tab.slots) > minIndexLen && 8*ix.live < len(tab.slots) {
					t.Fatalf("%d used, %d live in %d slots", ix.used, ix.live, len(tab.slots))
				}
			},
		})
	})
}

// TestFlowIndexConcurrent: readers always find a flow that stays in the
// index while writers add and remove others (growing, tombstoning and
// shrinking the table under them), and never find a removed one as another
// id. Meant for -race.
func TestFlowIndexConcurrent(t *testing.T) {
	var ix flowIndex[int]
	ix.init()
	const stay = 8
	stayers := make([]*flow[int], stay)
	for i := range stayers {
		id := fmt.Sprint("stay", i)
		stayers[i] = ix.getOrAdd(id, ix.hash(id), func() *flow[int] { return &flow[int]{id: id} })
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				f := stayers[(n+r)%stay]
				if got := ix.get(f.id, ix.hash(f.id)); got != f {
					t.Errorf("get(%q) = %p, want %p", f.id, got, f)
					return
				}
				id := fmt.Sprint("churn", n%500)
				if got := ix.get(id, ix.hash(id)); got != nil && got.id != id {
					t.Errorf("get(%q) found %q", id, got.id)
					return
				}
			}
		}()
	}
	var live []*flow[int]
	for round := range 20 {
		for i := range 500 {
			id := fmt.Sprint("churn", i)
			live = append(live, ix.getOrAdd(id, ix.hash(id), func() *flow[int] { return &flow[int]{id: id} }))
		}
		for _, f := range live[:len(live)-round] {
			ix.remove(f)
		}
		live = live[len(live)-round:]
	}
	stop.Store(true)
	wg.Wait()
}

// TestFlowLayout pins the layout flow's comment describes for an item of a
// word: 256 bytes (a size class whose objects start on a cache line), the
// producer's fields and the fifo in the first line, the tick's fair-share
// state in the second. A field added in the wrong place moves the hot ones
// apart, which only a benchmark at thousands of flows would show.
func TestFlowLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is planned for 64-bit words")
	}
	var f flow[int]
	if s := unsafe.Sizeof(f); s != 256 {
		t.Errorf("flow[int] is %d bytes, want 256", s)
	}
	line := func(off uintptr) uintptr { return off / 64 }
	for name, off := range map[string]uintptr{
		"id": unsafe.Offsetof(f.id), "count": unsafe.Offsetof(f.count), "fifo": unsafe.Offsetof(f.fifo),
		"reg": unsafe.Offsetof(f.reg), "edf": unsafe.Offsetof(f.edf), "inList": unsafe.Offsetof(f.inList),
	} {
		if line(off) != 0 {
			t.Errorf("%s at offset %d, not in the first cache line", name, off)
		}
	}
	for name, off := range map[string]uintptr{
		"start": unsafe.Offsetof(f.start), "finish": unsafe.Offsetof(f.finish), "order": unsafe.Offsetof(f.order),
		"vtIdx": unsafe.Offsetof(f.vtIdx), "last": unsafe.Offsetof(f.last), "dispatched": unsafe.Offsetof(f.dispatched),
	} {
		if line(off) != 1 {
			t.Errorf("%s at offset %d, not in the second cache line", name, off)
		}
	}
}

package flowcontrol

import (
	"testing"

	"github.com/emirpasic/gods/v2/queues/arrayqueue"
	"pgregory.net/rapid"
)

// TestFlowFIFOModel: a flow's queue, starting in the record's own two-entry
// buffer (inl) and growing out of it, wrapped around or not, is a FIFO (gods'
// arrayqueue is the model), and growing clears the buffer it leaves.
func TestFlowFIFOModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var fs flows[*int]
		f := fs.newFlow("f")
		model := arrayqueue.New[*int]()
		next := 0
		t.Repeat(map[string]func(*rapid.T){
			"push": func(t *rapid.T) {
				for range rapid.IntRange(1, 5).Draw(t, "n") {
					v := next
					next++
					inl := len(f.fifo.buf) == len(f.inl) && &f.fifo.buf[0] == &f.inl[0]
					f.push(qentry[*int]{item: &v})
					model.Enqueue(&v)
					if inl && &f.fifo.buf[0] != &f.inl[0] && f.inl != [2]qentry[*int]{} {
						t.Fatalf("grew out of inl without clearing it")
					}
				}
			},
			"pop": func(t *rapid.T) {
				want, ok := model.Dequeue()
				if !ok {
					t.Skip("empty")
				}
				if got := f.pop(); got.item != want {
					t.Fatalf("popped %d, model %d", *got.item, *want)
				}
			},
			"": func(t *rapid.T) {
				if f.len() != model.Size() {
					t.Fatalf("len %d, model %d", f.len(), model.Size())
				}
				if want, ok := model.Peek(); ok && f.head().item != want {
					t.Fatalf("head %d, model %d", *f.head().item, *want)
				}
			},
		})
	})
}

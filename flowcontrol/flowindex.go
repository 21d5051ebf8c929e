package flowcontrol

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
)

// flowIndex maps a band's flow ids to their flows: lock-free reads, writes
// under a mutex.
//
// Why not sync.Map: every EnqueueFlow of a flow band looks its flow up, and
// at thousands of flows sync.Map's hash trie costs a chain of dependent
// pointer loads (one per trie level) per item, most of them cache misses,
// and they dominated the dispatcher's time with many flows. Here a
// lookup is one hash and, nearly always, one slot: an open-addressed table
// (linear probing, at most three quarters full) whose slots hold the id's
// hash beside the flow, so a probe that misses does not touch the flow, and
// four slots share a cache line, so a longer probe costs little: the table
// is kept small (16 bytes a slot, 1.3 to 3.2 slots a flow) because at
// thousands of flows its cache misses are most of a lookup's time.
//
// Concurrency. Readers load the table pointer and probe with atomic loads.
// Writers (a new flow, a forgotten one) hold mu and change one slot at a
// time, or build a new table and publish it whole. A slot once used is never
// empty again in its table (a deleted flow leaves a tombstone), so a probe
// never stops short of an entry that is there; a reader racing with a write
// may miss a flow being added (the caller then takes mu and looks again) or
// find one being forgotten (its count says so: see flows.lookup). An
// unpublished table is never written after it is published, so a reader
// still on an old one sees a consistent, if stale, set.
type flowIndex[T any] struct {
	seed maphash.Seed
	tab  atomic.Pointer[flowTable[T]]
	mu   sync.Mutex
	live int // flows in tab; under mu
	used int // slots of tab not empty (live + tombstones); under mu
}

// flowTable is one generation of the index: a power-of-two array of slots.
type flowTable[T any] struct {
	mask  uint64
	slots []flowSlot[T]
}

// flowSlot is one slot. hash is 0 when the slot was never used, tombHash
// once its flow was deleted, and otherwise the flow's hash (whose top bit is
// set, so it is neither). A slot's hash is written after its flow, so a
// reader that sees the hash sees the flow (or, after a delete, nil).
type flowSlot[T any] struct {
	hash atomic.Uint64
	f    atomic.Pointer[flow[T]]
}

const (
	tombHash    = 1
	hashTopBit  = 1 << 63
	minIndexLen = 16
)

func (ix *flowIndex[T]) init() {
	ix.seed = maphash.MakeSeed()
	ix.tab.Store(&flowTable[T]{mask: minIndexLen - 1, slots: make([]flowSlot[T], minIndexLen)})
}

// hash returns id's hash with the top bit set (never 0 nor tombHash).
func (ix *flowIndex[T]) hash(id string) uint64 {
	return maphash.String(ix.seed, id) | hashTopBit
}

// get returns id's flow, or nil if the index does not hold it. h is
// ix.hash(id). Any goroutine; alloc-free.
func (ix *flowIndex[T]) get(id string, h uint64) *flow[T] {
	t := ix.tab.Load()
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		switch sh := s.hash.Load(); sh {
		case 0:
			return nil
		case h:
			if f := s.f.Load(); f != nil && f.id == id {
				return f
			}
		}
	}
}

// getOrAdd returns id's flow, adding the one mk makes if the index does not
// hold it. mk runs under the index's lock, at most once.
func (ix *flowIndex[T]) getOrAdd(id string, h uint64, mk func() *flow[T]) *flow[T] {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if f := ix.get(id, h); f != nil {
		return f
	}
	f := mk()
	t := ix.tab.Load()
	if 4*(ix.used+1) > 3*len(t.slots) {
		t = ix.rebuild(ix.live + 1)
	}
	i := h & t.mask
	for t.slots[i].hash.Load() > tombHash {
		i = (i + 1) & t.mask
	}
	s := &t.slots[i]
	if s.hash.Load() == 0 {
		ix.used++
	}
	s.f.Store(f)
	s.hash.Store(h)
	ix.live++
	return f
}

// remove deletes f from the index if it is there (idempotent, so producers
// may help the tick remove a flow they found forgotten).
func (ix *flowIndex[T]) remove(f *flow[T]) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	h := ix.hash(f.id)
	t := ix.tab.Load()
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		sh := s.hash.Load()
		if sh == 0 {
			return
		}
		if sh == h && s.f.Load() == f {
			s.hash.Store(tombHash)
			s.f.Store(nil)
			ix.live--
			break
		}
	}
	// Shrink a table that has become mostly empty (many flows gone), so
	// that a band's index keeps the size of its current flows.
	if len(t.slots) > minIndexLen && 8*ix.live < len(t.slots) {
		ix.rebuild(ix.live)
	}
}

// rebuild publishes a new table sized for n flows (at most 5/8 full, so
// that it has room to grow before the next rebuild) holding the live flows,
// without tombstones. Under mu.
func (ix *flowIndex[T]) rebuild(n int) *flowTable[T] {
	size := max(minIndexLen, 1<<bits.Len(uint((8*n-1)/5)))
	nt := &flowTable[T]{mask: uint64(size - 1), slots: make([]flowSlot[T], size)}
	old := ix.tab.Load()
	for k := range old.slots {
		f := old.slots[k].f.Load()
		if f == nil {
			continue
		}
		h := old.slots[k].hash.Load()
		i := h & nt.mask
		for nt.slots[i].hash.Load() != 0 {
			i = (i + 1) & nt.mask
		}
		nt.slots[i].f.Store(f)
		nt.slots[i].hash.Store(h)
	}
	ix.used = ix.live
	ix.tab.Store(nt)
	return nt
}

// each calls fn for every flow in the index (a racy walk, as sync.Map's
// Range: flows added or removed meanwhile may or may not be seen).
func (ix *flowIndex[T]) each(fn func(*flow[T])) {
	t := ix.tab.Load()
	for k := range t.slots {
		if f := t.slots[k].f.Load(); f != nil {
			fn(f)
		}
	}
}

package flowhttp

import "sync/atomic"

// memory is Options.MaxBodyMemory: the bytes of buffers held for gated
// bodies, being read, waiting or served (until the wrapped handler returns),
// over every band. A nil *memory bounds
// nothing.
//
// Requests placed in band 0 by their headers may fill it to total; the
// others only to shared, so the reserve between the two is always there
// for critical requests, whatever other clients upload. A buffer is charged
// before it is allocated, so the bound holds at every moment, not only on
// average.
type memory struct {
	total  int64 // what band 0 may fill it to
	shared int64 // what every other request may fill it to
	used   atomic.Int64
}

// acquire charges n bytes if they fit under the request's bound.
func (m *memory) acquire(n int64, critical bool) bool {
	if m == nil {
		return true
	}
	bound := m.shared
	if critical {
		bound = m.total
	}
	for {
		u := m.used.Load()
		if u+n > bound {
			return false
		}
		if m.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// release gives back n bytes acquire charged.
func (m *memory) release(n int64) {
	if m != nil && n != 0 {
		m.used.Add(-n)
	}
}

// inUse is the bytes charged now.
func (m *memory) inUse() int64 {
	if m == nil {
		return 0
	}
	return m.used.Load()
}

package flowhttp

import (
	"math"
	"sync"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// creditGrace is how long after Forward a request may stay out of its
// endpoint's reported waiting + running count before the credit takes it
// for finished: the time the server may take to show a request it has
// received (its network, parsing, tokenizing), with a wide margin.
const creditGrace = time.Second

// forwarded is one request Forward counted on an endpoint, in that
// endpoint's list until its done or its retirement.
type forwarded struct {
	prev, next *forwarded
	at         time.Time          // when Forward counted it (the poller's clock)
	list       *forwardedList     // nil once done or retired
	retired    bool               // retired by a reading (before its done)
	permit     flowcontrol.Permit // its controller slot (zero: none)
}

// forwardedList holds an endpoint's forwarded requests not yet done,
// oldest first, so that a reading showing the endpoint emptier than the
// requests forwarded to it before the scrape retires the oldest (retire).
type forwardedList struct {
	mu         sync.Mutex
	head, tail *forwarded
	endpoint   string // the poller's name for it (its metrics URL)
	base       string // the host's name for it (as given to Forward)
	poller     *saturation.Poller
	now        func() time.Time
	onRetire   func(endpoint string) // GatewayConfig.OnRetire, or nil
}

// push appends f, stamped now.
func (l *forwardedList) push(f *forwarded) {
	l.mu.Lock()
	f.at, f.list = l.now(), l
	f.prev = l.tail
	if l.tail != nil {
		l.tail.next = f
	} else {
		l.head = f
	}
	l.tail = f
	l.mu.Unlock()
}

// unlinkLocked takes f out of the list.
func (l *forwardedList) unlinkLocked(f *forwarded) {
	if f.prev != nil {
		f.prev.next = f.next
	} else {
		l.head = f.next
	}
	if f.next != nil {
		f.next.prev = f.prev
	} else {
		l.tail = f.prev
	}
	f.prev, f.next, f.list = nil, nil, nil
}

// done ends f: the endpoint's count goes down, unless f was done or
// retired already. It reports whether f was retired.
func (f *forwarded) done(l *forwardedList) (retired bool) {
	l.mu.Lock()
	if f.list != l {
		retired = f.retired
		l.mu.Unlock()
		return retired
	}
	l.unlinkLocked(f)
	l.mu.Unlock()
	l.poller.Finished(l.endpoint)
	return false
}

// retire applies a reading of the list's endpoint: of the requests
// forwarded at least creditGrace before the scrape was sent (A), those
// beyond the server's waiting + running (S) have finished there, whatever
// their clients still do with the answers; the A − S oldest leave the
// endpoint's count and release their controller slots now, and their done
// does nothing later. So the credit never scores as waiting a request the
// server reports finished (a client that stopped reading a streamed
// answer, say). Requests of other clients or gateway replicas in S only
// make it retire fewer. The host's OnRetire is called once per request
// retired, after the list's lock is released.
func (l *forwardedList) retire(r saturation.PodReading) {
	s := r.Waiting + r.Running
	if !(s >= 0) || r.LastAttempt.IsZero() {
		return
	}
	cutoff := r.LastAttempt.Add(-creditGrace)
	l.mu.Lock()
	a := 0
	for f := l.head; f != nil && f.at.Before(cutoff); f = f.next {
		a++
	}
	n := 0
	for k := float64(a) - math.Ceil(s); k > 0; k-- {
		f := l.head
		l.unlinkLocked(f)
		f.retired = true
		l.poller.Finished(l.endpoint)
		// The request's controller slot too: it counts as released to
		// the pool (the poller's Inc) until its Done.
		f.permit.Done()
		n++
	}
	l.mu.Unlock()
	if l.onRetire != nil {
		for range n {
			l.onRetire(l.base)
		}
	}
}

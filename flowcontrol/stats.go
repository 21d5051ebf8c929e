package flowcontrol

import "math"

// Stats is a snapshot of a dispatcher.
//
// Exactness: the outcome counters (Dispatched, Expired, Cancelled, Closed)
// and Queued are exact when the dispatcher is quiescent (no Enqueue and no
// tick in progress): then, per band, every accepted item (every Enqueue
// that returned nil, and every Requeue) is counted in exactly one of
// Queued, Dispatched, Expired, Cancelled, Closed. Under
// concurrent use each field is read atomically but fields are not read at
// one instant, so sums may be off by the operations in flight. An item's
// outcome is counted before its Dispatch or OnDrop runs, so the owner of an
// item (a Controller waiter) always finds its own outcome in Stats. Gate and
// Saturation are those of the last tick.
type Stats struct {
	// Saturation is the sanitised reading of the last tick (0 before the
	// first).
	Saturation float64
	// Ticks counts ticks: Step calls (Run's included; Flush excluded)
	// plus the ticks Run slept through while every band was empty.
	Ticks uint64
	// UnknownBand counts calls refused with ErrUnknownBand.
	UnknownBand uint64
	// Bands holds one entry per band, band 0 first.
	Bands []BandStats
	// Eviction is the Evictor's snapshot (Controller.Stats with
	// ControllerConfig.Eviction on); nil otherwise.
	Eviction *EvictionStats
}

// BandStats is the part of Stats for one band.
type BandStats struct {
	Queued     int    // items accepted and not yet ended
	Dispatched uint64 // items passed to Dispatch
	Expired    uint64 // dropped with ErrExpired
	Cancelled  uint64 // dropped with ErrCancelled
	Closed     uint64 // dropped with ErrClosed
	Rejected   uint64 // calls refused with ErrQueueFull (the band was full)
	// Refused counts the other calls refused before the queue.
	Refused Refusals
	Gate    Gate // the gate of the last tick ({1, 1} before the first)
	// FlowFull counts calls refused with ErrFlowFull (the item's flow held
	// the band's FlowCapacity; not counted in Rejected).
	FlowFull uint64
	// Flows is the number of flows the band knows (0 for an fcfs band):
	// those seen within its FlowIdle, see Dispatcher.Flows.
	Flows int
	// Requeued counts items put back by Requeue. Each is accepted again:
	// it is counted in Queued and then in one more outcome.
	Requeued uint64
}

// Refusals counts calls that never entered a band's queue, other than
// ErrQueueFull (BandStats.Rejected), by the error they returned. Refused
// calls end there: they have no queued outcome and no OnOutcome call.
type Refusals struct {
	Closed     uint64 // ErrClosed: the dispatcher was already closed
	Cancelled  uint64 // ErrCancelled: Controller.Wait's context had already ended
	NotRunning uint64 // ErrNotRunning: Controller.Wait with no Run going
	Shed       uint64 // ErrShed: Controller.Wait refused by ControllerConfig.Admitter
}

// Dropped returns the items dropped for any reason.
func (b BandStats) Dropped() uint64 { return b.Expired + b.Cancelled + b.Closed }

func floatBits(f float64) uint64 { return math.Float64bits(f) }

// Stats returns a snapshot; see Stats for what is exact. It allocates the
// Bands slice; it does not take the tick lock.
func (d *Dispatcher[T]) Stats() Stats {
	st := Stats{
		Saturation:  math.Float64frombits(d.saturation.Load()),
		Ticks:       d.ticks.Load(),
		UnknownBand: d.unknown.Load(),
		Bands:       make([]BandStats, len(d.bands)),
	}
	for i := range d.bands {
		b := &d.bands[i]
		st.Bands[i] = BandStats{
			Queued:     int(b.queued.Load()),
			Dispatched: b.dispatched.Load(),
			Expired:    b.expired.Load(),
			Cancelled:  b.cancelled.Load(),
			Closed:     b.closed.Load(),
			Rejected:   b.full.Load(),
			Requeued:   b.requeued.Load(),
			Refused:    Refusals{Closed: b.doorClosed.Load()},
			Gate: Gate{
				Ceiling: math.Float64frombits(b.ceiling.Load()),
				Every:   int(b.every.Load()),
			},
		}
		if b.flows != nil {
			st.Bands[i].FlowFull = b.flows.full.Load()
			st.Bands[i].Flows = int(b.flows.known.Load())
		}
	}
	return st
}

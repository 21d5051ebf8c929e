package cluster

import "math"

// StepStats summarises the steps the replicas began inside the arrival window:
// the sums a least-squares line of step duration on batch size needs, and the
// batch slots (requests served, one token each) per second of the window.
type StepStats struct {
	// N is the number of steps; SumB, SumD, SumBB and SumBD are Σ batch, Σ
	// duration (s), Σ batch² and Σ batch·duration over them (batch = requests
	// in the step).
	N, SumB, SumD, SumBB, SumBD float64
	// Rate is Σ batch over the window's steps per second of the window and
	// per replica: the tokens a replica emits per second, what throughput
	// is made of.
	Rate float64
}

func (st *StepStats) add(batch int, seconds float64) {
	b := float64(batch)
	st.N++
	st.SumB += b
	st.SumD += seconds
	st.SumBB += b * b
	st.SumBD += b * seconds
}

// Merge returns the sums of st and o (Rate is st's: it belongs to one run).
func (st StepStats) Merge(o StepStats) StepStats {
	return StepStats{N: st.N + o.N, SumB: st.SumB + o.SumB, SumD: st.SumD + o.SumD,
		SumBB: st.SumBB + o.SumBB, SumBD: st.SumBD + o.SumBD, Rate: st.Rate}
}

// Line fits step = a + b·batch by least squares (a, b in seconds); ok is false
// when the batches do not spread (fewer than two distinct sizes) or the fit is
// not a cost (a < 0 or b <= 0).
func (st StepStats) Line() (a, b float64, ok bool) {
	den := st.N*st.SumBB - st.SumB*st.SumB
	if st.N < 2 || !(den > 1e-9*st.N*st.SumBB) {
		return 0, 0, false
	}
	b = (st.N*st.SumBD - st.SumB*st.SumD) / den
	a = (st.SumD - b*st.SumB) / st.N
	return a, b, a >= 0 && b > 0
}

// StepBound is the critical TTFT p99 no gateway can beat while the pool keeps
// frac of the throughput whose token rate is rate (per replica, per second),
// from the step line a + b·batch: a replica emitting r = frac·rate tokens per
// second needs the batch B with B / (a + b·B) = r, so B = r·a / (1 − r·b) and
// steps of a / (1 − r·b). A critical request that arrives during a step waits
// for its end, then for the step that prefills it; at p99 the first is almost a
// whole step, so the bound is 2 steps. It returns the step (s), the batch and the
// bound (ms); ok is false when the line cannot reach r at any batch (r·b ≥ 1).
func StepBound(a, b, rate, frac float64) (step, batch, boundMs float64, ok bool) {
	r := frac * rate
	if !(r > 0) || !(b > 0) || !(a >= 0) || r*b >= 1 || math.IsInf(r, 0) {
		return 0, 0, 0, false
	}
	step = a / (1 - r*b)
	batch = r * step
	return step, batch, 2 * step * 1000, true
}

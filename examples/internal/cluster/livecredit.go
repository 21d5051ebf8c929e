package cluster

import (
	"math"
	"time"

	"github.com/flowgate/flowgate/saturation"
)

// LivePool is the pool score a saturation.Poller with Scorer.InFlightCredit reads
// (what flowhttp.Gateway's gate reads): the mean over rs of each pod's score without
// the credit, plus, for a usable pod with a finite score, 1/QueueDepthThreshold for each
// request in flight to it (Reading.InFlight) beyond the count
//
//	T = waiting + running + max(0, Q·score − waiting)
//
// at which its queue term passes that score (the poller's hinge, saturation/credit.go).
// Without the prompt-token term or a KV projection this equals sc.Pool with the credit;
// with them it is below it, since Pool also charges a credited request its share of the
// prompt tokens. The simulator scores flowgate's credited gateways with it so that its
// default row is the Gateway's wiring, not a stronger credit the Gateway does not run.
// sc.IgnoreStale is not modelled (the simulator never sets it): every pod counts.
func LivePool(sc saturation.Scorer, rs []saturation.Reading, now time.Time) float64 {
	off := sc
	off.InFlightCredit = false
	v := off.Pool(rs, now)
	if len(rs) == 0 || math.IsInf(v, 1) || !sc.InFlightCredit {
		return v
	}
	q := sc.QueueDepthThreshold
	if q <= 0 {
		q = saturation.DefaultQueueDepthThreshold
	}
	var excess float64
	for i := range rs {
		r := &rs[i]
		if !off.Usable(*r, now) {
			continue
		}
		base := off.Pod(*r, now)
		t := r.Waiting + r.Running + max(0, q*base-r.Waiting)
		excess += max(0, float64(r.InFlight)-t)
	}
	return v + excess/q/float64(len(rs))
}

package gateway

import (
	"sync/atomic"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// releasedCredit is the controller's saturation source when the in-flight
// credit is on: the poller's saturation plus the requests the controller has
// released whose handler has not forwarded them yet.
//
// Why: the poller credits a request when forward picks its backend
// (Poller.Dispatched), but the controller releases it earlier, in its own
// goroutine, and the handler's goroutine forwards it some scheduling delay
// later. A backlog released in one drain is therefore invisible to the gate
// that drains it, and Pacing.Recheck re-reads an unchanged saturation: 20 of
// 20 queued requests reached one pod in TestProxyBacklogDoesNotFloodOnReopen.
// Counting the gap here closes it: Controller.InFlight counts a release
// before the waiter wakes, forwarded counts the gated requests forward has
// handed to the poller, and their difference is what neither has counted.
//
// Each such request is charged as one waiting request on one of the N pods
// (1/(Q·N) of pool score), what the poller will charge once it is
// forwarded if the pod's queue term dominates; where the KV term does, the
// charge is an overestimate for that brief gap, erring towards gating.
type releasedCredit struct {
	poller    *saturation.Poller
	ctrl      atomic.Pointer[flowcontrol.Controller]
	forwarded atomic.Int64 // gated requests forward has passed to the poller and not finished
	per       float64      // pool score of one waiting request: 1/(Q·N)
}

func newReleasedCredit(p *saturation.Poller, queueThreshold float64, pods int) *releasedCredit {
	if queueThreshold <= 0 {
		queueThreshold = saturation.DefaultQueueDepthThreshold
	}
	return &releasedCredit{poller: p, per: 1 / (queueThreshold * float64(max(pods, 1)))}
}

// Saturation implements flowcontrol.SaturationSource.
func (c *releasedCredit) Saturation() float64 {
	s := c.poller.Saturation()
	if ctrl := c.ctrl.Load(); ctrl != nil {
		if gap := ctrl.InFlight() - c.forwarded.Load(); gap > 0 {
			s += float64(gap) * c.per
		}
	}
	return s
}

// ReadingSeq implements flowcontrol.ReadingSource: the poller's readings.
func (c *releasedCredit) ReadingSeq() uint64 { return c.poller.ReadingSeq() }

package main

import "time"

// stallGap is the lateness of a 1 ms tick that counts as a stall: far above
// a timer's ordinary jitter (tens of µs), near a CPU scheduler's slice.
const stallGap = 5 * time.Millisecond

// stallProbe measures how long this process waited for a CPU while a phase
// ran: a goroutine waits on a 1 ms ticker and adds up, for every gap between
// two ticks longer than stallGap, the gap less the period. The fake
// backends catch up after such a wait (it shows in Lost only when they give
// up), but the proxy and the client do not: a request that arrived during
// the wait is answered that much later, so a phase that stalled measures
// the machine, not the policy.
type stallProbe struct {
	stop    chan struct{}
	done    chan struct{}
	stalled time.Duration
}

func startStallProbe() *stallProbe {
	p := &stallProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		const period = time.Millisecond
		t := time.NewTicker(period)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-p.stop:
				return
			case now := <-t.C:
				if gap := now.Sub(last); gap > stallGap {
					p.stalled += gap - period
				}
				last = now
			}
		}
	}()
	return p
}

// Stop ends the probe and returns the time it counted as stalled.
func (p *stallProbe) Stop() time.Duration {
	close(p.stop)
	<-p.done
	return p.stalled
}

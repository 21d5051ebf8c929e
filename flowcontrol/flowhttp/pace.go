package flowhttp

import "time"

// BodyRateWindow is the window of the body rate rule (Options.MinBodyRate):
// from arrival + BodyGrace on, the bytes of a body that arrived in the last
// BodyRateWindow must be at least MinBodyRate times the part of that window
// past arrival + BodyGrace. Bytes sent early buy no idle time later: an
// upload that falls below the rate is cut within BodyRateWindow of doing so,
// whatever it sent before.
const BodyRateWindow = 10 * time.Second

// paceSlots is the number of checkpoints pace keeps over a window: arrivals
// are grouped in steps of BodyRateWindow/paceSlots, each step's bytes
// counted at its end (the rule is applied to within one step, in the
// client's favour).
const paceSlots = 16

// pace applies Options' time rules to one body: the rate rule over a
// sliding window (BodyRateWindow) and the idle rule. It allocates nothing.
type pace struct {
	start time.Time     // arrival
	from  time.Time     // arrival + BodyGrace: the rate rule applies from then
	rate  float64       // bytes per second; 0: no rate rule
	idle  time.Duration // 0: no idle rule
	win   time.Duration
	n     int64 // bytes so far
	// cp[:k] are checkpoints, oldest first: by cp[i].at, cp[i].n bytes had
	// arrived. cp[0] is at or before the start of the last window.
	cp [paceSlots + 2]struct {
		at time.Time
		n  int64
	}
	k int
}

func (p *pace) init(start time.Time, grace time.Duration, rate int64, idle time.Duration) {
	*p = pace{start: start, from: start.Add(grace), idle: idle, win: BodyRateWindow}
	if rate > 0 {
		p.rate = float64(rate)
	}
	p.cp[0].at, p.k = start, 1
}

// progress records that the body has n bytes at now.
func (p *pace) progress(n int64, now time.Time) {
	p.n = n
	step := p.win / paceSlots
	last := &p.cp[p.k-1]
	if p.k > 1 && now.Sub(p.cp[p.k-2].at) < step {
		// Within the last step: move its checkpoint forward.
		last.at, last.n = now, n
	} else if p.k < len(p.cp) {
		p.cp[p.k].at, p.cp[p.k].n = now, n
		p.k++
	} else {
		last.at, last.n = now, n
	}
	// Drop checkpoints the window has passed, keeping the newest one at
	// or before its start (it says how many bytes had come by then).
	cut := now.Add(-p.win)
	i := 0
	for i+1 < p.k && !p.cp[i+1].at.After(cut) {
		i++
	}
	if i > 0 {
		copy(p.cp[:], p.cp[i:p.k])
		p.k -= i
	}
}

// deadline is when the next byte must have arrived, if nothing more
// arrives before: the earlier of the rate rule's first breach and
// BodyIdleTimeout after now. Zero: no limit.
func (p *pace) deadline(now time.Time) time.Time {
	var d time.Time
	if p.rate > 0 {
		d = p.rateDeadline(now)
	}
	if p.idle > 0 {
		if i := now.Add(p.idle); d.IsZero() || i.Before(d) {
			d = i
		}
	}
	return d
}

// rateDeadline is the first t ≥ now at which, with no more bytes, the bytes
// of (t − win, t] fall below rate × min(win, t − from). While t − win lies
// between two checkpoints the window's bytes are constant and the floor only
// grows, so the answer is in the first segment whose bytes the floor can
// pass.
func (p *pace) rateDeadline(now time.Time) time.Time {
	full := p.rate * p.win.Seconds()
	for i := 0; i < p.k; i++ {
		// While t − win is in [cp[i].at, cp[i+1].at) the window holds
		// p.n − cp[i].n bytes (before cp[0], which is the arrival or
		// lies before now − win, as many or more).
		have := float64(p.n - p.cp[i].n)
		lo := now
		if i > 0 {
			lo = later(p.cp[i].at.Add(p.win), now)
		}
		if i+1 < p.k {
			hi := p.cp[i+1].at.Add(p.win)
			if !hi.After(lo) || have >= full {
				continue // passed, or more than the floor ever asks
			}
			if t := later(p.from.Add(secs(have/p.rate)), lo); t.Before(hi) {
				return t
			}
			continue
		}
		return later(p.from.Add(secs(have/p.rate)), lo)
	}
	return now
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

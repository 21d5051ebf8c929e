package cluster

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/examples/internal/workload"
)

// FuzzConfig fuzzes the simulator's configuration: what validate's
// documented rules refuse is an ErrInvalidConfig error; anything else
// either fails with a "cluster: " error or runs (when small enough for a
// fuzz iteration) with every request ending exactly once (completed,
// rejected, timed out or unfinished at the drain limit; checkInvariants
// when all finished), for every policy, with or without client timeouts
// and backend priority, under either routing (policy's top bit: inflight).
// Never a panic.
func FuzzConfig(f *testing.F) {
	f.Add(10.0, uint8(5), int64(50*time.Millisecond), int64(0), 2, 1, int64(0), 0, int64(0), 0, -1.0, int64(0), false)
	f.Add(40.0, uint8(4), int64(20*time.Millisecond), int64(time.Second), 1, 2, int64(time.Millisecond), 4, int64(10*time.Millisecond), 16, 0.0, int64(0), false)
	f.Add(0.0, uint8(5), int64(time.Second), int64(0), 0, 0, int64(0), 0, int64(0), 0, 0.5, int64(0), false)
	f.Add(math.Inf(1), uint8(5), int64(time.Millisecond), int64(0), 1, 1, int64(0), 0, int64(0), 0, 0.5, int64(0), false)
	f.Add(math.NaN(), uint8(4), int64(-1), int64(-1), -1, -1, int64(-1), -1, int64(-1), -1, math.NaN(), int64(-1), false)
	f.Add(1e-300, uint8(5), int64(time.Millisecond), int64(0), 1, 1, int64(0), 0, int64(0), 1, math.Inf(1), int64(0), false)
	f.Add(200.0, uint8(2), int64(time.Second), int64(time.Second), 2, 2, int64(0), 0, int64(0), 0, 0.5, int64(100*time.Millisecond), true)
	f.Add(200.0, uint8(3), int64(time.Second), int64(time.Second), 1, 3, int64(0), 0, int64(0), 0, 0.5, int64(300*time.Millisecond), false)
	f.Add(150.0, uint8(1), int64(time.Second), int64(time.Second), 2, 1, int64(0), 0, int64(0), 0, 0.5, int64(50*time.Millisecond), true)
	f.Add(100.0, uint8(0), int64(time.Second), int64(time.Second), 2, 1, int64(0), 0, int64(0), 0, 0.5, int64(0), false)
	f.Add(150.0, uint8(0x85), int64(time.Second), int64(time.Second), 2, 3, int64(0), 0, int64(0), 0, 0.5, int64(50*time.Millisecond), false)
	f.Add(40.0, uint8(0x81), int64(20*time.Millisecond), int64(time.Second), 3, 2, int64(time.Millisecond), 4, int64(10*time.Millisecond), 16, 0.0, int64(0), true)
	f.Fuzz(func(t *testing.T, qps float64, policy uint8, duration, drain int64, replicas, gateways int, tick int64, burst int,
		scrape int64, capacity int, cv float64, timeout int64, backendPrio bool) {
		ps := Policies()
		cfg := Config{Workload: workload.Chat, QPS: qps, Policy: ps[int(policy)%len(ps)], Duration: time.Duration(duration),
			DrainLimit: time.Duration(drain), Seed: 1, Replicas: replicas, Gateways: gateways, Tick: time.Duration(tick),
			Burst: burst, Scrape: time.Duration(scrape), Capacity: capacity, CV: cv,
			ClientTimeout: time.Duration(timeout), BackendPriority: backendPrio}
		if policy&0x80 != 0 {
			cfg.Routing = RoutingInFlight
		}
		valid := qps > 0 && !math.IsInf(qps, 1) && duration > 0 && drain >= 0 && replicas >= 0 && gateways >= 0 &&
			tick >= 0 && burst >= 0 && scrape >= 0 && capacity >= 0 && timeout >= 0
		small := valid && qps*float64(duration)/1e9 <= 200 && duration <= int64(time.Second) &&
			(drain == 0 && duration <= int64(50*time.Millisecond) || drain > 0 && drain <= int64(time.Second)) &&
			replicas <= 4 && gateways <= 4 && (tick == 0 || tick >= int64(100*time.Microsecond)) &&
			(scrape == 0 || scrape >= int64(time.Millisecond)) && capacity <= 1<<12 && (capacity > 0 || qps <= 1000)
		if valid && !small {
			t.Skip("valid, but too large to simulate in a fuzz iteration")
		}
		s, err := run(cfg)
		if !valid {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("run(%+v) = %v, want ErrInvalidConfig", cfg, err)
			}
			return
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "cluster: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
			return
		}
		// Every request ends exactly once: completed, rejected (queue
		// full) or unfinished at the drain limit; bands add up.
		res := s.result()
		n := len(s.reqs)
		ended := res.Critical.Completed + res.Sheddable.Completed + res.Critical.Rejected + res.Sheddable.Rejected +
			res.Critical.Timeouts + res.Sheddable.Timeouts + res.Unfinished
		if res.Critical.Requests+res.Sheddable.Requests != n || ended != n {
			t.Fatalf("%d requests: %+v", n, res)
		}
		var dispatched uint64
		for _, g := range s.gws {
			switch {
			case g.d != nil:
				for _, b := range g.d.Stats().Bands {
					dispatched += b.Dispatched
				}
			case g.l != nil:
				for _, b := range g.l.Stats().Bands {
					dispatched += b.Dispatched
				}
			default:
				dispatched += uint64(g.direct)
			}
		}
		if dispatched > uint64(n) {
			t.Fatalf("%d dispatches for %d requests", dispatched, n)
		}
		if res.Unfinished == 0 && res.Critical.Rejected+res.Sheddable.Rejected+res.Critical.Timeouts+res.Sheddable.Timeouts == 0 {
			checkInvariants(t, s)
		}
	})
}

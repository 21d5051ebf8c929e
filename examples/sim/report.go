package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/flowgate/flowgate/examples/internal/cluster"
)

// job is one experiment in output order.
type job struct {
	cfg cluster.Config
}

func (o options) jobs() []job {
	var js []job
	for _, w := range o.workloads {
		qs := o.qps
		if qs == nil {
			qs = w.QPS
		}
		for _, q := range qs {
			for _, p := range o.policies {
				js = append(js, job{o.config(w, q, p)})
			}
		}
	}
	return js
}

// runJobs runs the experiments on up to parallel goroutines. Each experiment is
// self-contained and deterministic, and results are stored by index, so the output
// does not depend on the parallelism or the scheduling.
func runJobs(js []job, parallel int, quiet bool, stderr io.Writer) ([]cluster.Result, error) {
	if parallel == 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	res := make([]cluster.Result, len(js))
	errs := make([]error, len(js))
	start := time.Now()
	var mu sync.Mutex
	done := 0
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(parallel, len(js)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t0 := time.Now()
				res[i], errs[i] = cluster.Run(js[i].cfg)
				if !quiet {
					mu.Lock()
					done++
					c := js[i].cfg
					fmt.Fprintf(stderr, "[%d/%d] %s@%g %s: %v\n", done, len(js), c.Workload.Name, c.QPS, c.Policy,
						time.Since(t0).Round(time.Millisecond))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range js {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	if !quiet {
		fmt.Fprintf(stderr, "%d experiments in %v (wall clock)\n", len(js), time.Since(start).Round(time.Millisecond))
	}
	return res, nil
}

func runAll(o options, stderr io.Writer) ([]cluster.Result, error) {
	return runJobs(o.jobs(), o.parallel, o.quiet, stderr)
}

// jsonRecord has exactly the keys the issue specifies, in its order.
type jsonRecord struct {
	Workload          string  `json:"workload"`
	QPS               float64 `json:"qps"`
	Policy            string  `json:"policy"`
	Seed              uint64  `json:"seed"`
	Requests          int     `json:"requests"`
	Completed         int     `json:"completed"`
	Rejected          int     `json:"rejected"`
	CriticalTTFTp50   float64 `json:"critical_ttft_p50_ms"`
	CriticalTTFTp99   float64 `json:"critical_ttft_p99_ms"`
	CriticalE2Ep99    float64 `json:"critical_e2e_p99_ms"`
	SheddableTTFTp99  float64 `json:"sheddable_ttft_p99_ms"`
	SheddableE2Ep99   float64 `json:"sheddable_e2e_p99_ms"`
	Throughput        float64 `json:"throughput_rps"`
	ShareDeadZone     float64 `json:"share_dead_zone"`
	ShareProportional float64 `json:"share_proportional"`
	ShareHardBlock    float64 `json:"share_hard_block"`
}

func writeJSON(w io.Writer, rs []cluster.Result) error {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		rec := jsonRecord{
			Workload: r.Workload, QPS: r.QPS, Policy: r.Policy, Seed: r.Seed,
			Requests:         r.Critical.Requests + r.Sheddable.Requests,
			Completed:        r.Critical.Completed + r.Sheddable.Completed,
			Rejected:         r.Critical.Rejected + r.Sheddable.Rejected,
			CriticalTTFTp50:  round3(r.Critical.TTFTp50),
			CriticalTTFTp99:  round3(r.Critical.TTFTp99),
			CriticalE2Ep99:   round3(r.Critical.E2Ep99),
			SheddableTTFTp99: round3(r.Sheddable.TTFTp99),
			SheddableE2Ep99:  round3(r.Sheddable.E2Ep99),
			Throughput:       round3(r.Critical.Throughput),
			ShareDeadZone:    round3(r.ShareDeadZone), ShareProportional: round3(r.ShareProportional),
			ShareHardBlock: round3(r.ShareHardBlock),
		}
		if err := enc.Encode(rec); err != nil {
			return err
		}
	}
	return nil
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// fmtMs prints a latency in ms below a second and in s above.
func fmtMs(ms float64) string {
	switch {
	case ms >= 100000:
		return fmt.Sprintf("%.0f s", ms/1000)
	case ms >= 1000:
		return fmt.Sprintf("%.1f s", ms/1000)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// change is (b − a)/a in percent.
func change(a, b float64) (float64, bool) {
	if a == 0 {
		return 0, false
	}
	return (b - a) / a * 100, true
}

func fmtChange(a, b float64) string {
	c, ok := change(a, b)
	if !ok {
		return "n/a"
	}
	if math.Abs(c) < 0.05 {
		c = 0 // no "-0.0 %"
	}
	return fmt.Sprintf("%+.1f %%", c)
}

// pair is the two policies' results at one (workload, qps) point.
type pair struct {
	static, soft *cluster.Result
}

func pairs(rs []cluster.Result) []pair {
	var ps []pair
	for i := range rs {
		r := &rs[i]
		if n := len(ps); n > 0 {
			last := &ps[n-1]
			cur := last.static
			if cur == nil {
				cur = last.soft
			}
			if cur.Workload == r.Workload && cur.QPS == r.QPS {
				if r.Policy == cluster.Static {
					last.static = r
				} else {
					last.soft = r
				}
				continue
			}
		}
		p := pair{}
		if r.Policy == cluster.Static {
			p.static = r
		} else {
			p.soft = r
		}
		ps = append(ps, p)
	}
	return ps
}

func writeTable(w io.Writer, o options, rs []cluster.Result) error {
	ps := pairs(rs)
	both := len(o.policies) == 2
	pf := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	if both {
		pf("Critical band, static (1.0) vs soft-reflective; change = (soft − static)/static.\n\n")
		pf("| workload | QPS | TTFT p99 static | TTFT p99 soft | change | E2E p99 static | E2E p99 soft | change | throughput static | throughput soft | change | rejected |\n")
		pf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, p := range ps {
			a, b := p.static, p.soft
			pf("| %s | %g | %s | %s | %s | %s | %s | %s | %.3f | %.3f | %s | %d |\n", a.Workload, a.QPS,
				fmtMs(a.Critical.TTFTp99), fmtMs(b.Critical.TTFTp99), fmtChange(a.Critical.TTFTp99, b.Critical.TTFTp99),
				fmtMs(a.Critical.E2Ep99), fmtMs(b.Critical.E2Ep99), fmtChange(a.Critical.E2Ep99, b.Critical.E2Ep99),
				a.Critical.Throughput, b.Critical.Throughput, fmtChange(a.Critical.Throughput, b.Critical.Throughput),
				a.Critical.Rejected+a.Sheddable.Rejected+b.Critical.Rejected+b.Sheddable.Rejected)
		}
		pf("\nSheddable band and gate regimes (share of ticks the sheddable band spent in dead zone / proportional / hard block).\n\n")
		pf("| workload | QPS | sheddable TTFT p99 static | sheddable TTFT p99 soft | sheddable E2E p99 static | sheddable E2E p99 soft | mean saturation static | mean saturation soft | regimes static | regimes soft | preemptions static / soft |\n")
		pf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |\n")
		for _, p := range ps {
			a, b := p.static, p.soft
			pf("| %s | %g | %s | %s | %s | %s | %.2f | %.2f | %s | %s | %d / %d |\n", a.Workload, a.QPS,
				fmtMs(a.Sheddable.TTFTp99), fmtMs(b.Sheddable.TTFTp99), fmtMs(a.Sheddable.E2Ep99), fmtMs(b.Sheddable.E2Ep99),
				a.MeanSaturation, b.MeanSaturation, regimes(a), regimes(b), a.Preemptions, b.Preemptions)
		}
		return nil
	}
	pf("| workload | QPS | policy | requests | completed | rejected | critical TTFT p50 | critical TTFT p99 | critical E2E p99 | sheddable TTFT p99 | sheddable E2E p99 | critical throughput | regimes (dead / prop / block) |\n")
	pf("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for i := range rs {
		r := &rs[i]
		pf("| %s | %g | %s | %d | %d | %d | %s | %s | %s | %s | %s | %.3f | %s |\n", r.Workload, r.QPS, r.Policy,
			r.Critical.Requests+r.Sheddable.Requests, r.Critical.Completed+r.Sheddable.Completed,
			r.Critical.Rejected+r.Sheddable.Rejected, fmtMs(r.Critical.TTFTp50), fmtMs(r.Critical.TTFTp99),
			fmtMs(r.Critical.E2Ep99), fmtMs(r.Sheddable.TTFTp99), fmtMs(r.Sheddable.E2Ep99), r.Critical.Throughput, regimes(r))
	}
	return nil
}

func regimes(r *cluster.Result) string {
	return fmt.Sprintf("%.0f / %.0f / %.0f %%", 100*r.ShareDeadZone, 100*r.ShareProportional, 100*r.ShareHardBlock)
}

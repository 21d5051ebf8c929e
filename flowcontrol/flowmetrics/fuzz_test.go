package flowmetrics_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowmetrics"
)

// fixedStats is a StatsSource with one snapshot.
type fixedStats flowcontrol.Stats

func (f fixedStats) Stats() flowcontrol.Stats { return flowcontrol.Stats(f) }

// FuzzNew fuzzes the collector's configuration (bands, band names,
// namespace, buckets, a constant label): New never panics; it returns an
// error prefixed "flowmetrics: " or a collector that registers, records a
// wait in every band and outcome, and gathers without error.
func FuzzNew(f *testing.F) {
	f.Add(2, "critical,sheddable", "", "", "", 0.0, 0.0, uint8(0))
	f.Add(3, "a,,c", "ns", "replica", "r1", 0.5, 1.0, uint8(2))
	f.Add(0, "", "", "", "", 0.0, 0.0, uint8(0))
	f.Add(flowcontrol.MaxBands+1, "", "", "", "", 0.0, 0.0, uint8(0))
	f.Add(2, "x,x", "", "", "", 0.0, 0.0, uint8(0))
	f.Add(2, "", "", "", "", 2.0, 1.0, uint8(2))                  // buckets not increasing
	f.Add(2, "", "", "", "", math.NaN(), 1.0, uint8(2))           // NaN bucket
	f.Add(2, "\xff", "", "", "", 0.0, 0.0, uint8(0))              // band name not UTF-8
	f.Add(2, "", "", "band", "x", 0.0, 0.0, uint8(0))             // constant label clashes with a variable one
	f.Add(2, "", "", "k", "\xff", 0.0, 0.0, uint8(0))             // constant label value not UTF-8
	f.Add(2, "", "a-b", "1bad", "v", 0.0, 0.0, uint8(0))          // names outside the legacy charset
	f.Add(1, "", "", "", "", math.Inf(-1), math.Inf(1), uint8(2)) // infinite buckets
	f.Fuzz(func(t *testing.T, bands int, names, namespace, labelKey, labelValue string, b1, b2 float64, nBuckets uint8) {
		if bands > 64 {
			bands = 64 + bands%64 // keep an iteration cheap; the upper bound has its seed
			if bands < 64 {
				bands = flowcontrol.MaxBands + 1
			}
		}
		opts := flowmetrics.Options{Namespace: namespace}
		if names != "" {
			opts.BandNames = strings.Split(names, ",")
		}
		switch nBuckets % 3 {
		case 1:
			opts.Buckets = []float64{b1}
		case 2:
			opts.Buckets = []float64{b1, b2}
		}
		if labelKey != "" {
			opts.ConstLabels = prometheus.Labels{labelKey: labelValue}
		}
		var c *flowmetrics.Collector
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("New(%d, %+v) panicked: %v", bands, opts, r)
				}
			}()
			c, err = flowmetrics.New(bands, opts)
			if err == nil {
				if berr := c.Bind(fixedStats{Bands: make([]flowcontrol.BandStats, max(bands, 0))}); berr != nil {
					t.Fatalf("Bind: %v", berr)
				}
			}
		}()
		if err != nil {
			if !strings.HasPrefix(err.Error(), "flowmetrics: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
			return
		}
		if bands < 1 || bands > flowcontrol.MaxBands {
			t.Fatalf("accepted bands %d", bands)
		}
		reg := prometheus.NewPedanticRegistry()
		if err := reg.Register(c); err != nil {
			t.Fatalf("New accepted %+v but it does not register: %v", opts, err)
		}
		for b := range bands {
			for _, e := range []error{nil, flowcontrol.ErrCancelled, flowcontrol.ErrExpired, flowcontrol.ErrClosed, flowcontrol.ErrQueueFull, errors.New("x")} {
				c.OnOutcome(b, e, time.Millisecond)
			}
		}
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("Gather: %v", err)
		}
	})
}

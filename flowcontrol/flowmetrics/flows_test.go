package flowmetrics_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/flowcontrol/flowmetrics"
)

type constSat float64

func (s constSat) Saturation() float64 { return float64(s) }

// flowSeries gathers the per-flow series of band "0": fairness_id → (depth,
// dispatched).
func flowSeries(t *testing.T, reg *prometheus.Registry) map[string][2]float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	out := map[string][2]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var id string
			for _, l := range m.GetLabel() {
				if l.GetName() == "fairness_id" {
					id = l.GetValue()
				}
			}
			v := out[id]
			switch f.GetName() {
			case "flowgate_flow_queue_depth":
				v[0] = m.GetGauge().GetValue()
			case "flowgate_flow_dispatched_total":
				v[1] = m.GetCounter().GetValue()
			default:
				continue
			}
			out[id] = v
		}
	}
	return out
}

// The fairness_id label is capped: with more flows than MaxFlowLabels the
// first ones keep their labels from scrape to scrape, the rest (and ids
// that cannot be label values: invalid UTF-8, or "other" itself) are summed
// under "other", and the sums agree with the dispatcher's.
func TestFlowLabelsCapped(t *testing.T) {
	const limit = 10
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{
		Config:   flowcontrol.Config{Bands: []flowcontrol.BandConfig{{Capacity: 1000, Fairness: flowcontrol.FairnessRoundRobin}}, Source: constSat(1)},
		Dispatch: func(int, int) {},
	})
	require.NoError(t, err)
	defer d.Close()
	col, err := flowmetrics.New(1, flowmetrics.Options{MaxFlowLabels: limit})
	require.NoError(t, err)
	require.NoError(t, col.Bind(d))
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(col))

	enq := func(id string, n int) {
		for range n {
			require.NoError(t, d.EnqueueFlow(0, id, 1, time.Time{}, 0))
		}
	}
	for i := range limit - 2 {
		enq("t"+strconv.Itoa(i), 1)
	}
	enq("other", 2)   // a real flow named like the overflow label
	enq("bad\xff", 3) // not valid UTF-8
	s := flowSeries(t, reg)
	require.Len(t, s, limit-2+1)
	require.Equal(t, [2]float64{5, 0}, s["other"])

	// Twenty more flows: two take the free labels, the rest go to other;
	// the first eight keep theirs.
	for i := limit - 2; i < limit+18; i++ {
		enq("t"+strconv.Itoa(i), 1)
	}
	s = flowSeries(t, reg)
	require.Len(t, s, limit+1)
	for i := range limit - 2 {
		require.Contains(t, s, "t"+strconv.Itoa(i))
	}
	total := 0.0
	for _, v := range s {
		total += v[0]
	}
	require.Equal(t, float64(d.Stats().Bands[0].Queued), total)
	require.Equal(t, [2]float64{5 + 18, 0}, s["other"])
}

func TestMaxFlowLabelsValidated(t *testing.T) {
	_, err := flowmetrics.New(1, flowmetrics.Options{MaxFlowLabels: -1})
	require.ErrorContains(t, err, "MaxFlowLabels")
}

package flowcontrol_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/queue"
)

// dispatcherInput is one fuzzed configuration.
type dispatcherInput struct {
	bands, capacity, burst int
	tick                   time.Duration
	maxWait                []time.Duration
	nilSource, nilDispatch bool
	static                 bool
}

// invalidFields is the model of NewDispatcher's validation: the fields the
// documentation says are wrong, by the name the error must use.
func (in dispatcherInput) invalidFields() []string {
	var bad []string
	if in.bands < 1 || in.bands > flowcontrol.MaxBands {
		bad = append(bad, "Bands")
	}
	if in.capacity < 1 || in.capacity > queue.MaxCapacity {
		bad = append(bad, "Capacity")
	}
	if in.nilSource {
		bad = append(bad, "Source")
	}
	if in.nilDispatch {
		bad = append(bad, "Dispatch")
	}
	if in.burst < 0 {
		bad = append(bad, "Burst")
	}
	if in.tick < 0 || in.tick > 0 && in.tick < flowcontrol.MinTick {
		bad = append(bad, "Tick")
	}
	// bandsOf gives one value to every band, or value i to band i.
	for i, w := range in.maxWait {
		if w < 0 && (len(in.maxWait) == 1 || i < in.bands) {
			bad = append(bad, "MaxWait")
			break
		}
	}
	return bad
}

// checkConfigError: an invalid configuration is an ErrInvalidConfig error,
// prefixed with the package name, naming one of the wrong fields.
func checkConfigError(t *testing.T, what string, err error, bad []string) {
	t.Helper()
	if len(bad) == 0 {
		if err != nil {
			t.Fatalf("%s: valid configuration refused: %v", what, err)
		}
		return
	}
	if err == nil {
		t.Fatalf("%s: accepted a configuration with bad %v", what, bad)
	}
	if !errors.Is(err, flowcontrol.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "flowcontrol: ") {
		t.Fatalf("%s: error %q is not a flowcontrol ErrInvalidConfig", what, err)
	}
	for _, f := range bad {
		if strings.Contains(err.Error(), f) {
			return
		}
	}
	t.Fatalf("%s: error %q names none of the bad fields %v", what, err, bad)
}

// FuzzNewDispatcher fuzzes the configuration validators of NewDispatcher
// and NewController against a model of the documented rules, and, when the
// configuration is valid (and small enough to allocate), runs the
// dispatcher: a band takes exactly Capacity items then ErrQueueFull, unknown
// bands are refused, band 0 goes at the first tick under soft-reflective at
// any saturation, and after Close every accepted item has exactly one
// outcome.
func FuzzNewDispatcher(f *testing.F) {
	f.Add(2, 16, 0, int64(0), uint8(0), int64(0), int64(0), uint8(0), 0.5)
	f.Add(4, 3, 2, int64(time.Millisecond), uint8(4), int64(time.Second), int64(0), uint8(0), math.NaN())
	f.Add(1, 1, 1, int64(1), uint8(1), int64(1), int64(0), uint8(4), math.Inf(1))
	f.Add(1, 1, 1, int64(flowcontrol.MinTick), uint8(1), int64(math.MaxInt64), int64(0), uint8(4), 1.0)
	f.Add(0, 16, 0, int64(0), uint8(0), int64(0), int64(0), uint8(0), 0.0)
	f.Add(flowcontrol.MaxBands+1, 16, 0, int64(0), uint8(0), int64(0), int64(0), uint8(0), 0.0)
	f.Add(2, 0, 0, int64(0), uint8(0), int64(0), int64(0), uint8(0), 0.0)
	f.Add(2, queue.MaxCapacity+1, 0, int64(0), uint8(0), int64(0), int64(0), uint8(0), 0.0)
	f.Add(2, 16, -1, int64(-1), uint8(3), int64(-5), int64(1), uint8(3), -1.0)
	f.Add(3, 8, 5, int64(0), uint8(3), int64(0), int64(-1), uint8(0), 2.0)
	f.Fuzz(func(t *testing.T, bands, capacity, burst int, tick int64, nWait uint8, w0, w1 int64, flags uint8, s float64) {
		in := dispatcherInput{
			bands: bands, capacity: capacity, burst: burst, tick: time.Duration(tick),
			nilSource: flags&1 != 0, nilDispatch: flags&2 != 0, static: flags&4 != 0,
		}
		for i := range int(nWait) {
			if i%2 == 0 {
				in.maxWait = append(in.maxWait, time.Duration(w0))
			} else {
				in.maxWait = append(in.maxWait, time.Duration(w1))
			}
		}
		bad := in.invalidFields()
		if len(bad) == 0 && int64(bands)*int64(capacity) > 1<<16 {
			t.Skip("valid but too large to allocate in a fuzz iteration")
		}
		var src flowcontrol.SaturationSource = constSat(s)
		if in.nilSource {
			src = nil
		}
		var policy flowcontrol.CeilingPolicy
		if in.static {
			policy = flowcontrol.NewStatic(1)
		}
		clk := newFakeClock()
		outcomes := map[int]int{}
		var dispatch func(int, int)
		if !in.nilDispatch {
			dispatch = func(_, item int) { outcomes[item]++ }
		}
		d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{Bands: bandsOf(bands, capacity, in.maxWait...), Policy: policy, Source: src, Burst: burst, Tick: in.tick, Now: clk.Now}, Dispatch: dispatch, OnDrop: func(_, item int, _ error) { outcomes[item]++ }})
		checkConfigError(t, "NewDispatcher", err, bad)

		// NewController validates the same fields (it supplies Dispatch).
		// (Not called when valid and too large to allocate.)
		cin := in
		cin.nilDispatch = false
		if cbad := cin.invalidFields(); len(cbad) > 0 || int64(bands)*int64(capacity) <= 1<<16 {
			_, cerr := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{Bands: bandsOf(bands, capacity, in.maxWait...), Policy: policy, Source: src, Burst: burst, Tick: in.tick, Now: clk.Now}})
			checkConfigError(t, "NewController", cerr, cbad)
		}
		if err != nil {
			return
		}

		// A valid dispatcher behaves.
		last := bands - 1
		item, accepted := 0, 0
		for range capacity {
			if err := d.Enqueue(last, item); err != nil {
				t.Fatalf("Enqueue %d of %d: %v", item, capacity, err)
			}
			item++
			accepted++
		}
		if err := d.Enqueue(last, -1); !errors.Is(err, flowcontrol.ErrQueueFull) {
			t.Fatalf("Enqueue beyond Capacity %d: %v, want ErrQueueFull", capacity, err)
		}
		for _, b := range []int{-1, bands, math.MinInt} {
			if err := d.Enqueue(b, -1); !errors.Is(err, flowcontrol.ErrUnknownBand) {
				t.Fatalf("Enqueue(band %d): %v, want ErrUnknownBand", b, err)
			}
		}
		critical := -2
		if bands > 1 {
			critical = item
			if err := d.Enqueue(0, critical); err != nil {
				t.Fatalf("Enqueue band 0: %v", err)
			}
			accepted++
		}
		d.Step()
		if critical >= 0 && !in.static && outcomes[critical] != 1 {
			t.Fatalf("band 0 item not dispatched at the first tick (saturation %v)", s)
		}
		for range 3 {
			clk.Advance(time.Duration(max(tick, 1)))
			d.Step()
		}
		d.Close()
		if err := d.Enqueue(0, -1); !errors.Is(err, flowcontrol.ErrClosed) {
			t.Fatalf("Enqueue after Close: %v", err)
		}
		if len(outcomes) != accepted {
			t.Fatalf("%d of %d accepted items have an outcome", len(outcomes), accepted)
		}
		for it, n := range outcomes {
			if n != 1 || it < 0 {
				t.Fatalf("item %d has %d outcomes", it, n)
			}
		}
	})
}

// FuzzPolicyByName fuzzes the policy registry: an unknown name, an unknown
// parameter or a bad threshold is an ErrInvalidConfig error; a policy it
// returns is total (any band, bands, saturation) and never gates band 0 when
// it is the soft-reflective one.
func FuzzPolicyByName(f *testing.F) {
	f.Add(flowcontrol.StaticPolicyName, "threshold", 0.8, true, 1, 2, 0.9)
	f.Add(flowcontrol.StaticPolicyName, "threshold", math.NaN(), true, 0, 2, 1.0)
	f.Add(flowcontrol.StaticPolicyName, "threshold", -1.0, true, 0, 2, 1.0)
	f.Add(flowcontrol.StaticPolicyName, "burst", 1.0, true, 0, 2, 1.0)
	f.Add(flowcontrol.StaticPolicyName, "", 0.0, false, 0, 1, math.Inf(1))
	f.Add(flowcontrol.SoftReflectivePolicyName, "", 0.0, false, 0, 2, math.NaN())
	f.Add(flowcontrol.SoftReflectivePolicyName, "threshold", 1.0, true, 3, 4, 0.7)
	f.Add("soft-reflective", "", 0.0, false, 1, 2, 0.5)
	f.Add(flowcontrol.StaticPolicyName, "threshold", 0.0, true, 0, 2, 0.0)
	f.Add(flowcontrol.StaticPolicyName, "", 0.0, false, 1, 2, 0.6)
	f.Add(flowcontrol.StaticPolicyName, "", 0.0, false, 7, 8, 0.999)
	f.Add(flowcontrol.PriorityHoldbackPolicyName, "minCeiling", 0.4, true, 1, 3, 0.5)
	f.Add(flowcontrol.PriorityHoldbackPolicyName, "minCeiling", 0.0, true, 1, 2, 0.0)
	f.Add(flowcontrol.PriorityHoldbackPolicyName, "minCeiling", 1.0, true, 1, 2, 0.5)
	f.Add(flowcontrol.PriorityHoldbackPolicyName, "maxCeiling", 0.9, true, 0, 2, 0.5)
	f.Add(flowcontrol.PriorityHoldbackPolicyName, "", 0.0, false, 0, 2, 0.5)
	f.Fuzz(func(t *testing.T, name, key string, value float64, withParam bool, band, bands int, s float64) {
		var params map[string]float64
		if withParam {
			params = map[string]float64{key: value}
		}
		valid := false
		switch name {
		case flowcontrol.StaticPolicyName:
			valid = !withParam || (key == "threshold" && value > 0)
		case flowcontrol.PriorityHoldbackPolicyName:
			valid = withParam && key == "minCeiling" && value >= 0 && value < 1
		case flowcontrol.SoftReflectivePolicyName:
			valid = !withParam
		}
		p, err := flowcontrol.PolicyByName(name, params)
		if valid != (err == nil) {
			t.Fatalf("PolicyByName(%q, %v): %v, model says valid=%v", name, params, err, valid)
		}
		if err != nil {
			if !errors.Is(err, flowcontrol.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "flowcontrol: ") {
				t.Fatalf("error %q is not a flowcontrol ErrInvalidConfig", err)
			}
			return
		}
		g := p.Gate(band, bands, s)
		if g.Every < 0 || g.Every > flowcontrol.MaxEvery || g.Ceiling != g.Ceiling {
			t.Fatalf("%s.Gate(%d, %d, %v) = %+v", name, band, bands, s, g)
		}
		if name == flowcontrol.SoftReflectivePolicyName {
			checkGate(t.Fatalf, band, bands, s)
			return
		}
		if name == flowcontrol.PriorityHoldbackPolicyName {
			checkCeilingGate(t.Fatalf, p, band, bands, s)
			return
		}
		// Static: every band blocked exactly when the sanitised
		// saturation reaches the threshold, open below it.
		threshold := flowcontrol.DefaultStaticThreshold
		if withParam {
			threshold = value
		}
		if p.(*flowcontrol.Static).Threshold() != threshold {
			t.Fatalf("static threshold %v, want %v", p.(*flowcontrol.Static).Threshold(), threshold)
		}
		checkCeilingGate(t.Fatalf, p, band, bands, s)
	})
}

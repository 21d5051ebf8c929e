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

// TestConfigValidation is the table of every configuration rule: each bad
// config is refused with an error wrapping ErrInvalidConfig, prefixed with
// the package name and naming the field, by NewDispatcher and NewController
// alike (they share Config).
func TestConfigValidation(t *testing.T) {
	base := func() flowcontrol.Config {
		return flowcontrol.Config{Bands: bandsOf(2, 8), Source: newSat(0)}
	}
	for _, tc := range []struct {
		field string
		mod   func(*flowcontrol.Config)
	}{
		{"Bands", func(c *flowcontrol.Config) { c.Bands = nil }},
		{"Bands", func(c *flowcontrol.Config) { c.Bands = bandsOf(flowcontrol.MaxBands+1, 1) }},
		{"Bands[0].Capacity", func(c *flowcontrol.Config) { c.Bands[0].Capacity = 0 }},
		{"Bands[1].Capacity", func(c *flowcontrol.Config) { c.Bands[1].Capacity = queue.MaxCapacity + 1 }},
		{"Bands[1].MaxWait", func(c *flowcontrol.Config) { c.Bands[1].MaxWait = -time.Nanosecond }},
		{"Bands[0].MaxBytes", func(c *flowcontrol.Config) { c.Bands[0].MaxBytes = -1 }},
		{"Bands[1].Name", func(c *flowcontrol.Config) { c.Bands[0].Name, c.Bands[1].Name = "x", "x" }},
		{"Bands[1].Name", func(c *flowcontrol.Config) { c.Bands[1].Name = "band0" }}, // clashes with band 0's default
		{"Bands[0].Name", func(c *flowcontrol.Config) { c.Bands[0].Name = "crit\x00ical" }},
		{"Bands[0].Name", func(c *flowcontrol.Config) { c.Bands[0].Name = "a\nb" }},
		{"Bands[0].Name", func(c *flowcontrol.Config) { c.Bands[0].Name = "\xff" }},
		{"Bands[0].Name", func(c *flowcontrol.Config) { c.Bands[0].Name = strings.Repeat("n", flowcontrol.MaxBandNameLen+1) }},
		{"Source", func(c *flowcontrol.Config) { c.Source = nil }},
		{"Burst", func(c *flowcontrol.Config) { c.Burst = -1 }},
		{"Tick", func(c *flowcontrol.Config) { c.Tick = -time.Second }},
		{"Tick", func(c *flowcontrol.Config) { c.Tick = time.Nanosecond }},
		{"Tick", func(c *flowcontrol.Config) { c.Tick = flowcontrol.MinTick - 1 }},
	} {
		cfg := base()
		tc.mod(&cfg)
		_, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: cfg, Dispatch: func(int, int) {}})
		checkInvalid(t, "NewDispatcher", tc.field, err)
		_, err = flowcontrol.NewController(flowcontrol.ControllerConfig{Config: cfg})
		checkInvalid(t, "NewController", tc.field, err)
		if strings.HasPrefix(tc.field, "Bands") {
			_, err = flowcontrol.CheckBands(cfg.Bands)
			checkInvalid(t, "CheckBands", tc.field, err)
		}
	}
	_, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: base()})
	checkInvalid(t, "NewDispatcher", "Dispatch", err)

	// The boundaries are accepted.
	cfg := base()
	cfg.Tick = flowcontrol.MinTick
	cfg.Bands[0].Name = "critical ünïcode"
	cfg.Bands[1].MaxWait = math.MaxInt64
	d, err := flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: cfg, Dispatch: func(int, int) {}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Tick() != flowcontrol.MinTick || d.Bands() != 2 {
		t.Errorf("tick %v bands %d", d.Tick(), d.Bands())
	}
	d, err = flowcontrol.NewDispatcher(flowcontrol.DispatcherConfig[int]{Config: base(), Dispatch: func(int, int) {}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Tick() != flowcontrol.DefaultTick {
		t.Errorf("default tick %v", d.Tick())
	}
	if got := d.BandConfigs(); got[0].Name != "band0" || got[1].Name != "band1" {
		t.Errorf("default names %q %q", got[0].Name, got[1].Name)
	}
	// CheckBands defaults the names in a copy, leaving its argument alone.
	in := bandsOf(2, 8)
	in[1].Name = "sheddable"
	got, err := flowcontrol.CheckBands(in)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Name != "band0" || got[1].Name != "sheddable" || in[0].Name != "" || &got[0] == &in[0] {
		t.Errorf("CheckBands names %q %q, input %q", got[0].Name, got[1].Name, in[0].Name)
	}
}

func checkInvalid(t *testing.T, ctor, field string, err error) {
	t.Helper()
	if !errors.Is(err, flowcontrol.ErrInvalidConfig) || !strings.Contains(err.Error(), field) || !strings.HasPrefix(err.Error(), "flowcontrol: ") {
		t.Errorf("%s %s: err = %v, want ErrInvalidConfig naming the field", ctor, field, err)
	}
}

// TestStaticThresholdValidation: a static threshold ≤ 0 or NaN blocks every
// band but band 0 forever; PolicyByName refuses it.
func TestStaticThresholdValidation(t *testing.T) {
	for _, v := range []float64{0, -1, math.NaN(), math.Inf(-1)} {
		_, err := flowcontrol.PolicyByName(flowcontrol.StaticPolicyName, map[string]float64{"threshold": v})
		checkInvalid(t, "PolicyByName", "threshold", err)
	}
	for _, v := range []float64{1e-9, 0.5, 1, 2, math.Inf(1)} {
		if _, err := flowcontrol.PolicyByName(flowcontrol.StaticPolicyName, map[string]float64{"threshold": v}); err != nil {
			t.Errorf("threshold %v: %v", v, err)
		}
	}
}

// TestDeadlineSaturates: a MaxWait so long that now + MaxWait overflows
// means "never expires" (it used to wrap negative and expire every item on
// the first tick), and an item whose deadline falls exactly on the
// dispatcher's base time is not mistaken for one without a deadline.
func TestDeadlineSaturates(t *testing.T) {
	clk := newFakeClock()
	var r rec
	d := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: bandsOf(1, 4, 2562047*time.Hour), Source: newSat(5), Policy: closedStatic(t), BlockCritical: true, Now: clk.Now,
	}}, &r)
	clk.Advance(time.Hour)
	if err := d.Enqueue(0, 1); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		d.Step()
		clk.Advance(24 * time.Hour)
	}
	if st := d.Stats(); st.Bands[0].Expired != 0 || st.Bands[0].Queued != 1 {
		t.Fatalf("overflowing deadline: %+v", st.Bands[0])
	}

	// A 1 ns MaxWait from the base time: the deadline is base+1 ns, and it
	// must expire (not be read as "no deadline").
	clk2 := newFakeClock()
	var r2 rec
	d2 := newTestDispatcher(t, flowcontrol.DispatcherConfig[int]{Config: flowcontrol.Config{
		Bands: bandsOf(1, 4, time.Nanosecond), Source: newSat(5), Policy: closedStatic(t), BlockCritical: true, Now: clk2.Now,
	}}, &r2)
	if err := d2.Enqueue(0, 1); err != nil {
		t.Fatal(err)
	}
	clk2.Advance(time.Nanosecond)
	d2.Step()
	if st := d2.Stats(); st.Bands[0].Expired != 1 {
		t.Fatalf("1 ns deadline at the base time did not expire: %+v", st.Bands[0])
	}
}

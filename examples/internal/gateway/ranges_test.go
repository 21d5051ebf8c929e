package gateway

import (
	"reflect"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// TestConfigRangesMatchTheLibrary: an in tag that restates a bound of
// flowcontrol, saturation or this package takes exactly the values it allows.
func TestConfigRangesMatchTheLibrary(t *testing.T) {
	for _, tc := range []struct {
		typ      reflect.Type
		field    string
		min, max float64
	}{
		{reflect.TypeFor[fileFlowControl](), "Tick", float64(flowcontrol.MinTick), float64(time.Second)},
		{reflect.TypeFor[fileQueue](), "FlowCapacity", 0, MaxBandCapacity},
		{reflect.TypeFor[SaturationConfig](), "MetricsStalenessThreshold", float64(saturation.MinStaleness), float64(saturation.MaxStaleness)},
		{reflect.TypeFor[fileDetector](), "MetricsStalenessThreshold", float64(saturation.MinStaleness), float64(saturation.MaxStaleness)},
		{reflect.TypeFor[SaturationConfig](), "ScrapeInterval", float64(saturation.MinInterval), float64(saturation.MaxInterval)},
	} {
		f, _ := tc.typ.FieldByName(tc.field)
		r := f.Tag.Get("in")
		if !inRange(tc.min, r) || !inRange(tc.max, r) || inRange(tc.min-1, r) || inRange(tc.max+1, r) {
			t.Errorf("%v.%s: in %q, want [%v, %v]", tc.typ, tc.field, r, tc.min, tc.max)
		}
	}
}

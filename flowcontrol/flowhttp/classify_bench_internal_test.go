package flowhttp

import (
	"net/http"
	"testing"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// classifyOnce runs the classification of one request as ServeHTTP does:
// grant, band before the body, body scan, band after it.
func classifyOnce(in *intake, r *http.Request, body []byte) int {
	ceiling, _ := in.grant(r)
	_ = in.preBand(r.Header, ceiling)
	p, ok, bad := readPriority(body)
	if bad {
		return -1
	}
	return in.classifyBand(r, body, ceiling, p, ok)
}

// BenchmarkClassify prices the classification of one request, headers and
// body, as the handler runs it (no queueing): a labelled request, an
// unlabelled one with a body priority, and an unlabelled one without.
func BenchmarkClassify(b *testing.B) {
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{
		Bands: DefaultBands(), Source: new(saturation.Value)}})
	if err != nil {
		b.Fatal(err)
	}
	in, err := newIntake(c, Options{})
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name, objective, body string
	}{
		{"header", "Critical", `{"model":"m","prompt":"hello"}`},
		{"body-priority", "", `{"model":"m","prompt":"hello","priority":0}`},
		{"none", "", `{"model":"m","prompt":"hello"}`},
	}
	for _, tc := range cases {
		r, _ := http.NewRequest(http.MethodPost, "http://gw/v1/completions", nil)
		if tc.objective != "" {
			r.Header.Set(ObjectiveHeader, tc.objective)
		}
		body := []byte(tc.body)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				classifyOnce(in, r, body)
			}
		})
	}
}

// Classifying a labelled or unlabelled request allocates nothing (a body
// priority costs its decode).
func TestClassifyAllocs(t *testing.T) {
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{
		Bands: DefaultBands(), Source: new(saturation.Value)}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := newIntake(c, Options{Identify: func(r *http.Request) (Identity, bool) { return Identity{Ceiling: 0, Flow: "t"}, true }})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := http.NewRequest(http.MethodPost, "http://gw/v1/completions", nil)
	r.Header["X-Llm-D-Inference-Objective"] = []string{"Critical", "SHEDDABLE, critical"}
	body := []byte(`{"model":"m","prompt":"hello"}`)
	if n := testing.AllocsPerRun(100, func() { classifyOnce(in, r, body) }); n != 0 {
		t.Errorf("%v allocations per classification, want 0", n)
	}
	anon, err := newIntake(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set(FairnessIDHeader, "tenant")
	if n := testing.AllocsPerRun(100, func() { classifyOnce(anon, r, body) }); n != 0 {
		t.Errorf("%v allocations per anonymous classification, want 0", n)
	}
}

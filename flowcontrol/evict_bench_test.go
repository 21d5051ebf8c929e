package flowcontrol_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
)

// BenchmarkEvictor measures, at the shipped defaults, what eviction adds
// to a request (Track, Start, Done with 1,000 others in flight on 100
// endpoints) and what one Check costs with those 1,000 in flight and a
// full pool (nothing stalled: the scan finds no demand).
func BenchmarkEvictor(b *testing.B) {
	const live, endpoints = 1000, 100
	eps := make([]string, endpoints)
	for i := range eps {
		eps[i] = fmt.Sprint("10.0.0.", i, ":8000")
	}
	setup := func(b *testing.B) *flowcontrol.Evictor {
		now := time.Unix(0, 0)
		ev, err := flowcontrol.NewEvictor(flowcontrol.EvictionConfig{KVUsage: fullKV}, 3, saturationOf(1), nil,
			func() time.Time { return now })
		if err != nil {
			b.Fatal(err)
		}
		for i := range live {
			ev.Track(i%3, eps[i%endpoints], func() {}).Start()
		}
		return ev
	}
	b.Run("track-start-done", func(b *testing.B) {
		ev := setup(b)
		act := func() {}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			t := ev.Track(1, eps[i%endpoints], act)
			t.Start()
			t.Done()
			i++
		}
	})
	b.Run("check", func(b *testing.B) {
		ev := setup(b)
		b.ReportAllocs()
		for b.Loop() {
			ev.Check()
		}
	})
}

package redisshare

import (
	"sync/atomic"
	"testing"
)

// sink keeps the compiler from discarding the loads.
var sink int64

// BenchmarkInFlightRead is the request-path read: own + others from memory.
// The plain atomic.Int64 load beside it is the floor; the handle read is two
// such loads. No Redis is contacted (the view is never synced here).
func BenchmarkInFlightRead(b *testing.B) {
	v, err := New(Options{Addr: "127.0.0.1:1", ReplicaID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	for _, name := range []string{"10.0.0.7:8000", "10.0.0.8:8000", "10.0.0.9:8000", "10.0.0.10:8000"} {
		v.Add(name, 3)
	}
	ep := v.Endpoint("10.0.0.8:8000")
	ep.others.Store(5)
	b.Run("atomicInt64", func(b *testing.B) {
		var n atomic.Int64
		n.Store(8)
		b.ReportAllocs()
		var s int64
		for b.Loop() {
			s += n.Load()
		}
		sink = s
	})
	b.Run("handle", func(b *testing.B) {
		b.ReportAllocs()
		var s int64
		for b.Loop() {
			s += ep.InFlight()
		}
		sink = s
	})
	b.Run("byName", func(b *testing.B) {
		b.ReportAllocs()
		var s int64
		for b.Loop() {
			s += v.InFlight("10.0.0.8:8000")
		}
		sink = s
	})
}

// BenchmarkIncDec is the request-path update: Inc on dispatch, Dec on done.
func BenchmarkIncDec(b *testing.B) {
	v, err := New(Options{Addr: "127.0.0.1:1", ReplicaID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	ep := v.Endpoint("10.0.0.8:8000")
	b.Run("atomicInt64", func(b *testing.B) {
		var n atomic.Int64
		b.ReportAllocs()
		for b.Loop() {
			n.Add(1)
			n.Add(-1)
		}
	})
	b.Run("handle", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ep.Inc()
			ep.Dec()
		}
	})
	b.Run("parallelHandle", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ep.Inc()
				ep.Dec()
			}
		})
	})
}

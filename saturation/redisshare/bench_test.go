package redisshare

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// BenchmarkSync is one replica's sync (one round trip) against a real
// redis-server holding 7 other replicas' hashes of 4 endpoints each: the
// cost per Period. redis-cpu-µs/op is the server's CPU (user+sys, from INFO)
// per sync, from which the Redis load of a pool follows: replicas × 1/Period
// × that.
func BenchmarkSync(b *testing.B) {
	srv := startRedis(b)
	eps := []string{"10.0.0.7:8000", "10.0.0.8:8000", "10.0.0.9:8000", "10.0.0.10:8000"}
	var views []*InFlight
	for i := range 8 {
		v, err := New(Options{Addr: srv.Addr(), ReplicaID: fmt.Sprintf("gw-%d", i), Period: 100 * time.Millisecond, TTL: time.Minute,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		defer v.Close()
		for j, ep := range eps {
			v.Add(ep, int64(i+j+1))
		}
		if err := v.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		views = append(views, v)
	}
	v := views[0]
	if err := v.Sync(context.Background()); err != nil || v.Peers() != 7 {
		b.Fatalf("setup: %v, %d peers", err, v.Peers())
	}
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	cpu := func() float64 {
		info, err := raw.Info(context.Background(), "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total float64
		for _, line := range strings.Split(info, "\r\n") {
			k, val, _ := strings.Cut(line, ":")
			if k == "used_cpu_user" || k == "used_cpu_sys" {
				f, _ := strconv.ParseFloat(val, 64)
				total += f
			}
		}
		return total
	}
	before := cpu()
	b.ReportAllocs()
	for b.Loop() {
		if err := v.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((cpu()-before)*1e6/float64(b.N), "redis-cpu-µs/op")
}

// BenchmarkSyncFailureRate runs one replica's syncs as Run paces them
// (every DefaultPeriod, the next starting a Period after the last began,
// or at once when it took longer) against a real redis-server holding 7
// peers' hashes, at several per-sync timeouts: the 4 ms that was the
// default (4/5 of Period), and longer ones up to DefaultTimeout. It reports
// the share of syncs that failed (failed-%) and the 99th percentile of
// their durations. Run it beside a CPU hog to see what a loaded node does
// (the package doc has the figures and the command); -benchtime=2000x is
// 10 s of syncs per timeout.
func BenchmarkSyncFailureRate(b *testing.B) {
	srv := startRedis(b)
	// 7 peers publishing 4 endpoints each, syncing every 100 ms for the
	// whole run (a peer that stopped would leave the directory after its
	// one-minute GC age, and the replica measured would read nothing).
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for i := range 7 {
		// Setup only: a timeout a loaded machine cannot miss.
		v, err := New(Options{Addr: srv.Addr(), ReplicaID: fmt.Sprintf("peer-%d", i), TTL: time.Hour, Period: 100 * time.Millisecond,
			Timeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		for j := range 4 {
			v.Add(fmt.Sprintf("10.0.0.%d:8000", j), int64(i+j+1))
		}
		if err := v.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = v.Run(ctx); _ = v.Close() }()
	}
	for _, timeout := range []time.Duration{4 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, DefaultTimeout} {
		b.Run("timeout="+timeout.String(), func(b *testing.B) {
			v, err := New(Options{Addr: srv.Addr(), ReplicaID: "bench", Timeout: timeout, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			defer v.Close()
			for j := range 4 {
				v.Add(fmt.Sprintf("10.0.0.%d:8000", j), 2)
			}
			for range 3 { // connect and learn the peers
				_ = v.Sync(ctx)
			}
			t := time.NewTimer(0)
			defer t.Stop()
			durations := make([]time.Duration, 0, b.N)
			failed := 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				<-t.C
				begin := time.Now()
				if err := v.sync(ctx, v.timeout); err != nil {
					failed++
				}
				d := time.Since(begin)
				durations = append(durations, d)
				t.Reset(max(0, v.period-d))
			}
			b.StopTimer()
			slices.Sort(durations)
			b.ReportMetric(100*float64(failed)/float64(b.N), "failed-%")
			b.ReportMetric(float64(durations[len(durations)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(durations[len(durations)-1].Microseconds())/1000, "max-ms")
			b.ReportMetric(float64(v.Peers()), "peers")
		})
	}
}

package redisshare

import (
	"errors"
	"maps"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestParseCount(t *testing.T) {
	for s, want := range map[string]int64{"0": 0, "1": 1, "42": 42, "4294967296": MaxCount} {
		if n, err := parseCount(s); err != nil || n != want {
			t.Errorf("parseCount(%q) = %d, %v; want %d", s, n, err, want)
		}
	}
	for _, s := range []string{"", "-1", "+1", "01", " 1", "1 ", "1.5", "0x10", "4294967297", "99999999999", "9223372036854775808", "abc"} {
		if n, err := parseCount(s); err == nil {
			t.Errorf("parseCount(%q) = %d, want an error", s, n)
		}
	}
}

func TestParseSnapshotSkipsHeartbeatZeroAndGarbage(t *testing.T) {
	got, bad := parseSnapshot(map[string]string{"": "1767225600000", "a": "3", "b": "0", "c": "-2", "d": "x"})
	if want := map[string]int64{"a": 3}; !maps.Equal(got, want) || bad != 2 {
		t.Fatalf("parseSnapshot = %v, bad %d; want %v, bad 2", got, bad, want)
	}
}

func TestTrackerKeepsViewUntilStaleThenDrops(t *testing.T) {
	tr := tracker{ttl: time.Second}
	fail := errors.New("down")
	if _, up, changed := tr.observe(t0, nil, fail); up || changed {
		t.Fatalf("before any success: up %v changed %v, want down, unchanged", up, changed)
	}
	others, up, changed := tr.observe(t0, []map[string]int64{{"a": 1}, {"a": 2, "b": 5}}, nil)
	if !up || !changed || !maps.Equal(others, map[string]int64{"a": 3, "b": 5}) {
		t.Fatalf("first success: %v up %v changed %v", others, up, changed)
	}
	if others, up, changed = tr.observe(t0.Add(time.Second), nil, fail); !up || changed || others["a"] != 3 {
		t.Fatalf("failure at exactly TTL: %v up %v changed %v; want the old view kept", others, up, changed)
	}
	if others, up, changed = tr.observe(t0.Add(time.Second+1), nil, fail); up || !changed || others != nil {
		t.Fatalf("failure beyond TTL: %v up %v changed %v; want dropped", others, up, changed)
	}
	if _, up, changed = tr.observe(t0.Add(2*time.Second), nil, fail); up || changed {
		t.Fatalf("still failing: up %v changed %v; want one transition only", up, changed)
	}
	if others, up, changed = tr.observe(t0.Add(3*time.Second), nil, nil); !up || !changed || len(others) != 0 {
		t.Fatalf("recovery with no peers: %v up %v changed %v", others, up, changed)
	}
	if !tr.stop() || tr.stop() {
		t.Fatal("stop: want one transition")
	}
}

// TestTrackerMatchesModel checks the summing and TTL bookkeeping against a
// model written from the spec: the view is up exactly when the last
// successful sync is at most TTL old, and then it is the per-endpoint sum of
// that sync's peer snapshots; otherwise it is empty. Transitions are
// reported exactly when up changes.
func TestTrackerMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ttl := time.Duration(rapid.IntRange(1, 50).Draw(t, "ttlMs")) * time.Millisecond
		tr := tracker{ttl: ttl}
		now := t0
		var (
			hasOK   bool
			lastOK  time.Time
			lastSum map[string]int64
			wasUp   bool
		)
		for i := range rapid.IntRange(1, 60).Draw(t, "steps") {
			now = now.Add(time.Duration(rapid.IntRange(0, int(3*ttl/time.Millisecond)).Draw(t, "dtMs")) * time.Millisecond)
			var snaps []map[string]int64
			var err error
			if rapid.Bool().Draw(t, "ok") {
				for range rapid.IntRange(0, 4).Draw(t, "peers") {
					snaps = append(snaps, rapid.MapOf(rapid.SampledFrom([]string{"a", "b", "c", "d"}), rapid.Int64Range(1, MaxCount)).Draw(t, "snap"))
				}
				hasOK, lastOK = true, now
				lastSum = map[string]int64{}
				for _, s := range snaps {
					for ep, n := range s {
						lastSum[ep] += n
					}
				}
			} else {
				err = errors.New("redis down")
			}
			wantUp := hasOK && now.Sub(lastOK) <= ttl
			var want map[string]int64
			if wantUp {
				want = lastSum
			}
			others, up, changed := tr.observe(now, snaps, err)
			if up != wantUp || changed != (up != wasUp) {
				t.Fatalf("step %d: up %v changed %v; model up %v (was %v)", i, up, changed, wantUp, wasUp)
			}
			if !maps.Equal(others, want) {
				t.Fatalf("step %d: view %v, model %v", i, others, want)
			}
			wasUp = up
		}
	})
}

func TestFormatParseRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.Int64Range(0, MaxCount).Draw(t, "n")
		if got, err := parseCount(formatCount(n)); err != nil || got != n {
			t.Fatalf("parseCount(formatCount(%d)) = %d, %v", n, got, err)
		}
	})
}

// An Endpoint plugs into anything that takes the Controller's in-flight
// counter shape.
var _ interface {
	Inc()
	Dec()
} = (*Endpoint)(nil)

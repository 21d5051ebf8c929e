package flowhttp

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// The rate rule over its window, on a fake clock: early bytes buy no idle
// time, a steady upload at the rate is never cut, and a pause longer than
// the window always is.
func TestPaceWindow(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var p pace
	p.init(t0, 5*time.Second, 1024, 0)
	// Nothing sent: the rule starts at the end of the grace.
	require.Equal(t, at(5*time.Second), p.deadline(t0))
	// 7 MiB in the first second: the next byte is due a window later.
	p.progress(7<<20, at(time.Second))
	require.Equal(t, at(time.Second+BodyRateWindow), p.deadline(at(time.Second)))
	// One byte every 4 s after that: cut once the burst leaves the window.
	n := int64(7 << 20)
	now := at(time.Second)
	for {
		next := now.Add(4 * time.Second)
		if next.After(p.deadline(now)) {
			break
		}
		now, n = next, n+1
		p.progress(n, now)
	}
	cut := p.deadline(now)
	require.LessOrEqual(t, cut.Sub(at(time.Second)), BodyRateWindow+BodyRateWindow/paceSlots, "cut at %v", cut.Sub(t0))

	// A steady 2 KiB/s upload for ten minutes is never cut.
	p.init(t0, 5*time.Second, 1024, 0)
	for i := 1; i <= 600; i++ {
		now := at(time.Duration(i) * time.Second)
		require.True(t, p.deadline(now.Add(-time.Second)).After(now), "second %d", i)
		p.progress(int64(i)*2048, now)
	}
	// At half the rate it is cut within about two windows.
	p.init(t0, 5*time.Second, 1024, 0)
	var i int
	for i = 1; i <= 600; i++ {
		now := at(time.Duration(i) * time.Second)
		if !p.deadline(now.Add(-time.Second)).After(now) {
			break
		}
		p.progress(int64(i)*512, now)
	}
	require.Less(t, i, 30)
}

// deadlineWriter is a ResponseWriter whose read deadline a fake body obeys.
type deadlineWriter struct {
	discard
	mu sync.Mutex
	d  time.Time
}

func (w *deadlineWriter) Header() http.Header { return http.Header{} }
func (w *deadlineWriter) WriteHeader(int)     {}
func (w *deadlineWriter) SetReadDeadline(d time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.d = d
	return nil
}

func (w *deadlineWriter) deadline() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.d
}

// slowBody sends burst bytes at once, then one byte every gap, and fails
// as a connection does when its read deadline passes first.
type slowBody struct {
	w     *deadlineWriter
	burst int
	gap   time.Duration
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.burst > 0 {
		n := min(len(p), b.burst, 256<<10)
		b.burst -= n
		time.Sleep(time.Millisecond)
		return n, nil
	}
	next := time.Now().Add(b.gap)
	if d := b.w.deadline(); !d.IsZero() && next.After(d) {
		time.Sleep(time.Until(d))
		return 0, os.ErrDeadlineExceeded
	}
	time.Sleep(b.gap)
	p[0] = 'x'
	return 1, nil
}

func (b *slowBody) Close() error { return nil }

// Seven uploads that send 7 MiB fast, then one byte every 4 s, hold the
// shared body memory; they are cut within BodyRateWindow of their burst
// (before the window, they held it for about two hours: the rate rule
// credited the early bytes), and a sheddable upload they kept out fits
// again.
func TestSlowUploadsFreeTheBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := &intake{maxBody: DefaultMaxBodyBytes, grace: DefaultBodyGrace, rate: DefaultMinBodyRate,
			idle: DefaultBodyIdleTimeout, mem: &memory{total: 64 << 20, shared: 60 << 20}}
		small := func() error {
			r, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 5<<20)))
			_, held, err := in.readBody(&deadlineWriter{}, r, time.Now(), false)
			in.mem.release(held)
			return err
		}
		start := time.Now()
		var wg sync.WaitGroup
		cut := make(chan time.Duration, 7)
		for i := range 7 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 100 * time.Millisecond) // one buffer grows at a time
				w := &deadlineWriter{}
				r, _ := http.NewRequest(http.MethodPost, "/", io.NopCloser(nil))
				r.Body = &slowBody{w: w, burst: 7 << 20, gap: 4 * time.Second}
				r.ContentLength = -1
				_, held, err := in.readBody(w, r, time.Now(), false)
				in.mem.release(held)
				if !errors.Is(err, ErrBodyTimeout) {
					t.Errorf("slow upload: %v", err)
				}
				cut <- time.Since(start)
			})
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Equal(t, int64(56<<20), in.mem.inUse(), "the seven hold the shared memory")
		require.ErrorIs(t, small(), ErrMemoryFull)
		wg.Wait()
		close(cut)
		var last time.Duration
		for d := range cut {
			last = max(last, d)
		}
		// Each burst ends within the first second.
		t.Logf("slow uploads cut after %v", last)
		require.LessOrEqual(t, last, time.Second+BodyRateWindow+BodyRateWindow/paceSlots)
		require.Zero(t, in.mem.inUse())
		require.NoError(t, small())
	})
}

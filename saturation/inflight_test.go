package saturation

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestInFlightBasics(t *testing.T) {
	f, err := NewInFlight(4)
	require.NoError(t, err)
	assert.Equal(t, 0.0, f.Saturation())
	f.Inc()
	f.Inc()
	assert.Equal(t, int64(2), f.Count())
	assert.Equal(t, 0.5, f.Saturation())
	for i := 0; i < 4; i++ {
		f.Inc()
	}
	assert.Equal(t, 1.5, f.Saturation(), "over capacity reads above 1")
	for i := 0; i < 8; i++ {
		f.Dec()
	}
	assert.Equal(t, int64(0), f.Count(), "Dec never goes below zero")
	assert.Equal(t, int64(2), f.Underflows(), "the two extra Decs are counted")
	assert.Equal(t, 0.0, f.Saturation())

	// It satisfies the Controller's optional InFlight field.
	var _ interface {
		Inc()
		Dec()
	} = f

	_, err = NewInFlight(-3)
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// TestInFlightModel is a rapid state machine against a plain counter model.
func TestInFlightModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.IntRange(1, 50).Draw(t, "capacity")
		f, err := NewInFlight(capacity)
		if err != nil {
			t.Fatal(err)
		}
		var count, under int64
		t.Repeat(map[string]func(*rapid.T){
			"inc": func(t *rapid.T) { f.Inc(); count++ },
			"dec": func(t *rapid.T) {
				f.Dec()
				if count == 0 {
					under++
				} else {
					count--
				}
			},
			"": func(t *rapid.T) {
				if f.Count() != count || f.Underflows() != under {
					t.Fatalf("count %d underflows %d, model %d %d", f.Count(), f.Underflows(), count, under)
				}
				if want := float64(count) / float64(capacity); f.Saturation() != want {
					t.Fatalf("saturation %v, model %v", f.Saturation(), want)
				}
			},
		})
	})
}

// TestInFlightStress: concurrent Inc/Dec pairs leave exactly zero, with no
// underflow, and concurrent excess Decs are each counted exactly once.
func TestInFlightStress(t *testing.T) {
	f, err := NewInFlight(100)
	require.NoError(t, err)
	const goroutines = 8
	per := 5000 * scale()
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				f.Inc()
				if s := f.Saturation(); s <= 0 {
					t.Errorf("saturation %v right after Inc", s)
					return
				}
				f.Dec()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(0), f.Count())
	assert.Equal(t, int64(0), f.Underflows())

	// 3·per Incs against 4·per Decs: exactly per Decs must be refused,
	// whatever the interleaving.
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if g%4 == 0 {
					f.Dec()
				} else {
					f.Inc()
				}
			}
		}()
	}
	wg.Wait()
	for i := 0; i < goroutines/4*3*per; i++ {
		f.Dec()
	}
	// Total Incs: 6·per, total Decs: 2·per + 6·per = 8·per.
	assert.Equal(t, int64(0), f.Count())
	assert.Equal(t, int64(2*per), f.Underflows())
}

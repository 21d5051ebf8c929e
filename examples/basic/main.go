// Command basic shows flowgate's flowcontrol package end to end: a Controller
// with two bands, a saturation that climbs from idle to overloaded, and
// critical and sheddable "requests" waiting for their turn. It prints, per
// saturation level, how many requests of each band were released in a fixed
// window: critical keeps flowing, sheddable is slowed smoothly, then held.
package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/flowcontrol"
	"github.com/flowgate/flowgate/saturation"
)

// The saturation package's in-flight counter plugs into a Controller both as
// its InFlight hook and as a saturation source, with no import between the
// two packages.
var (
	_ flowcontrol.InFlightCounter  = (*saturation.InFlight)(nil)
	_ flowcontrol.SaturationSource = (*saturation.InFlight)(nil)
)

// level is a saturation the program sets by hand (a real host uses a
// saturation source fed by its model servers' metrics).
type level struct{ bits atomic.Uint64 }

func (l *level) Set(v float64)       { l.bits.Store(math.Float64bits(v)) }
func (l *level) Saturation() float64 { return math.Float64frombits(l.bits.Load()) }

func main() {
	sat := &level{}
	c, err := flowcontrol.NewController(flowcontrol.ControllerConfig{Config: flowcontrol.Config{
		Bands:  []flowcontrol.BandConfig{{Name: "critical", Capacity: 64}, {Name: "sheddable", Capacity: 64}},
		Source: sat,
		Burst:  1,
		Tick:   time.Millisecond,
	}})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := c.Start(ctx)

	fmt.Println("saturation  critical released  sheddable released  (200 ms window, 1 ms tick, burst 1)")
	for _, s := range []float64{0, 0.5, 0.6, 0.75, 0.9, 1, 1.5} {
		sat.Set(s)
		var released [2]atomic.Int64
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		var wg sync.WaitGroup
		for band := 0; band < 2; band++ {
			// Four clients per band, each sending its next request as
			// soon as the previous one is released.
			for client := 0; client < 4; client++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						p, err := c.Wait(wctx, band)
						if err != nil {
							if !errors.Is(err, flowcontrol.ErrCancelled) {
								fmt.Println("wait:", err)
							}
							return
						}
						released[band].Add(1)
						p.Done() // the "request" finishes at once
					}
				}()
			}
		}
		wg.Wait()
		cancel()
		fmt.Printf("%10.2f  %17d  %18d\n", s, released[0].Load(), released[1].Load())
	}
	st := c.Stats()
	fmt.Printf("ticks %d; band 1 dispatched %d, cancelled %d\n", st.Ticks, st.Bands[1].Dispatched, st.Bands[1].Cancelled)
	c.Close()
	if err := <-ran; !errors.Is(err, flowcontrol.ErrClosed) {
		panic(err)
	}
}

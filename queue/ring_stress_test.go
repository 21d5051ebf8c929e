package queue_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/flowgate/flowgate/queue"
)

// tagged is a stress-test item: which producer pushed it, and its sequence
// number within that producer.
type tagged struct {
	producer int
	seq      int
}

type stressCase struct {
	producers, consumers, capacity int
	batch                          bool // consumers use TryPopN
}

// TestRingStress runs P producers against C consumers on small rings, so the
// ring wraps constantly and is often full and often empty, and accounts for
// every item exactly. Run it under -race. Nobody sleeps: a failed TryPush or
// TryPop yields and retries.
func TestRingStress(t *testing.T) {
	total := 96_000 // items per case; each producer pushes total/P
	if *long {
		total *= 20
	}
	cases := []stressCase{
		{4, 1, 2, false}, {4, 4, 2, false}, {1, 4, 64, false}, {8, 2, 64, false},
		{4, 1, 64, false}, {1, 1, 1, false}, {3, 3, 1, false},
		{4, 1, 64, true}, {4, 3, 8, true}, {2, 2, 2, true},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%dx%d/cap%d", c.producers, c.consumers, c.capacity)
		if c.batch {
			name += "/batch"
		}
		t.Run(name, func(t *testing.T) { stress(t, c, total/c.producers) })
	}
}

func stress(t *testing.T, c stressCase, perProducer int) {
	r := queue.NewRing[tagged](c.capacity)
	want := int64(c.producers * perProducer)
	var popped atomic.Int64
	logs := make([][]tagged, c.consumers) // what each consumer saw, in order
	var producing, consuming sync.WaitGroup
	var produced atomic.Bool
	for p := range c.producers {
		producing.Go(func() {
			for seq := range perProducer {
				for !r.TryPush(tagged{p, seq}) {
					runtime.Gosched()
				}
			}
		})
	}
	// Consumers stop once the producers are done and every position pushed
	// has been claimed (Len 0), not when they have counted all items: a
	// ring that loses items then fails the accounting below instead of
	// hanging the test.
	for k := range c.consumers {
		consuming.Go(func() {
			buf := make([]tagged, 2*c.capacity+1)
			var log []tagged
			for i := 0; ; i++ {
				n := 0
				if c.batch {
					// Vary the batch length, including longer than Cap.
					n = r.TryPopN(buf[:1+i%len(buf)])
					log = append(log, buf[:n]...)
				} else if v, ok := r.TryPop(); ok {
					n = 1
					log = append(log, v)
				}
				if n == 0 {
					if produced.Load() && r.Len() == 0 {
						break
					}
					runtime.Gosched()
					continue
				}
				popped.Add(int64(n))
			}
			logs[k] = log
		})
	}
	producing.Wait()
	produced.Store(true)
	consuming.Wait()

	seen := make([][]int, c.producers)
	for p := range seen {
		seen[p] = make([]int, perProducer)
	}
	for k, log := range logs {
		last := make([]int, c.producers) // last seq + 1 this consumer saw from each producer
		for _, it := range log {
			if it.producer < 0 || it.producer >= c.producers || it.seq < 0 || it.seq >= perProducer {
				t.Fatalf("consumer %d popped an item never pushed: %+v", k, it)
			}
			seen[it.producer][it.seq]++
			// FIFO: any one consumer sees each producer's items in push
			// order; a lone consumer sees all of them, so consecutively.
			if it.seq < last[it.producer] {
				t.Fatalf("consumer %d saw producer %d's item %d after item %d", k, it.producer, it.seq, last[it.producer]-1)
			}
			if c.consumers == 1 && it.seq != last[it.producer] {
				t.Fatalf("lone consumer saw producer %d's item %d after item %d", it.producer, it.seq, last[it.producer]-1)
			}
			last[it.producer] = it.seq + 1
		}
	}
	for p := range seen {
		for seq, n := range seen[p] {
			if n != 1 {
				t.Fatalf("producer %d's item %d was popped %d times", p, seq, n)
			}
		}
	}
	if got := popped.Load(); got != want {
		t.Fatalf("popped %d items, pushed %d", got, want)
	}
	if n := r.Len(); n != 0 {
		t.Fatalf("Len() = %d after draining", n)
	}
	if v, ok := r.TryPop(); ok {
		t.Fatalf("TryPop() after draining returned %+v", v)
	}
}

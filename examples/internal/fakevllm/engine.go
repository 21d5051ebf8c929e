// Package fakevllm is an OpenAI-compatible HTTP server whose token timing comes from the simulator's vLLM replica model running in real time.
package fakevllm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/examples/internal/vllm"
)

// ErrClosed is returned to requests submitted after Close, and ends the
// streams of requests still in the model when it closes.
var ErrClosed = errors.New("fakevllm: closed")

// maxLag is how far the engine may fall behind the wall clock before it
// stops trying to catch up: past it the schedule is re-anchored, so that a
// stall (GC, a busy machine) does not turn into a burst of back-to-back steps.
const maxLag = 20 * time.Millisecond

// stream is one request's view of the model: the engine publishes how many
// tokens the request has generated; the HTTP handler waits on notify and
// writes what is new. notify is 1-buffered, so tokens produced while the
// handler is busy writing coalesce into one wake-up.
type stream struct {
	req       vllm.Request
	generated atomic.Int64 // tokens sampled so far, published after each step
	finished  atomic.Bool
	notify    chan struct{}
	reported  int // engine-only: the last count published
}

func (s *stream) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// engine runs one vllm.Replica in real time: a goroutine calls Begin,
// sleeps the step's modelled duration divided by the speed-up, calls Finish,
// and publishes the tokens each request generated.
type engine struct {
	speedUp float64

	mu      sync.Mutex // guards rep, streams, nextID
	rep     *vllm.Replica
	streams map[uint64]*stream
	nextID  uint64
	metrics vllm.Metrics // as of the last finished step (vLLM's exporter lag)
	// onFinish, if set (under mu), observes each finished request's prompt
	// and generated lengths, as vLLM's length histograms do.
	onFinish func(input, generated int)

	wake   chan struct{} // 1-buffered: work was added to an idle engine
	closed chan struct{}
	once   sync.Once
	done   chan struct{} // closed when the loop has returned

	steps     atomic.Uint64
	completed atomic.Uint64
	aborted   atomic.Uint64
	lost      atomic.Int64 // wall-clock nanoseconds the driver fell behind and forgave
}

func newEngine(cfg vllm.Config, speedUp float64) (*engine, error) {
	e, err := build(cfg, speedUp)
	if err != nil {
		return nil, err
	}
	go e.loop()
	return e, nil
}

// build returns an engine whose loop is not running: newEngine starts it;
// the tests call begin and finish themselves.
func build(cfg vllm.Config, speedUp float64) (*engine, error) {
	rep, err := vllm.New(cfg)
	if err != nil {
		return nil, err
	}
	return &engine{
		speedUp: speedUp,
		rep:     rep,
		streams: map[uint64]*stream{},
		wake:    make(chan struct{}, 1),
		closed:  make(chan struct{}),
		done:    make(chan struct{}),
	}, nil
}

// add submits a request to the model's waiting queue.
func (e *engine) add(input, output, priority int) (*stream, error) {
	select {
	case <-e.closed:
		return nil, ErrClosed
	default:
	}
	e.mu.Lock()
	e.nextID++
	s := &stream{req: vllm.Request{ID: e.nextID, Input: input, Output: output, Priority: priority}, notify: make(chan struct{}, 1)}
	if err := e.rep.Add(&s.req); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	e.streams[s.req.ID] = s
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return s, nil
}

// snapshot returns the gauges vLLM would export now.
func (e *engine) snapshot() vllm.Metrics {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.metrics
}

func (e *engine) close() {
	e.once.Do(func() { close(e.closed) })
	<-e.done
}

// loop is the real-time driver. Model time is anchored to the wall clock
// when the engine wakes from idle; each step's end is scheduled at
// anchor + (model time elapsed)/speedUp, so that timer overshoot on one step
// is absorbed by the next instead of accumulating.
func (e *engine) loop() {
	defer close(e.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var (
		anchor  time.Time
		elapsed time.Duration // model time since anchor
		idle    = true
		events  []vllm.Event
	)
	for {
		var d time.Duration
		var ok bool
		d, events, ok = e.begin(events[:0])
		if !ok {
			idle = true
			select {
			case <-e.wake:
				continue
			case <-e.closed:
				e.shutdown()
				return
			}
		}
		now := time.Now()
		if idle {
			anchor, elapsed, idle = now, 0, false
		}
		elapsed += d
		target := anchor.Add(time.Duration(float64(elapsed) / e.speedUp))
		if lag := now.Sub(target); lag > maxLag {
			// Too far behind: forget the debt rather than burst, and
			// count it: the model ran slower than real time by lag.
			e.lost.Add(int64(lag))
			anchor, elapsed = now, 0
			target = now
		}
		if wait := target.Sub(now); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-e.closed:
				timer.Stop()
				e.shutdown()
				return
			}
		}
		events = e.finish(events[:0])
		e.steps.Add(1)
	}
}

// begin schedules the model's next step: its duration, and false when the
// model has nothing to do.
func (e *engine) begin(events []vllm.Event) (time.Duration, []vllm.Event, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rep.Begin(events)
}

// finish applies the step begin scheduled, refreshes the exported gauges and
// publishes each request's new tokens to its stream.
func (e *engine) finish(events []vllm.Event) []vllm.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	events = e.rep.Finish(events)
	e.metrics = e.rep.Metrics()
	for _, q := range e.rep.Running() {
		if s := e.streams[q.ID]; s != nil && s.reported != q.Generated() {
			s.reported = q.Generated()
			s.generated.Store(int64(s.reported))
			s.wake()
		}
	}
	for _, ev := range events {
		if ev.Kind != vllm.Finished {
			continue
		}
		if s := e.streams[ev.Req.ID]; s != nil {
			delete(e.streams, ev.Req.ID)
			s.generated.Store(int64(ev.Req.Generated()))
			s.finished.Store(true)
			s.wake()
			e.completed.Add(1)
			if e.onFinish != nil {
				e.onFinish(ev.Req.Input, ev.Req.Generated())
			}
		}
	}
	return events
}

// abort takes s out of the model if it is still there (its client went
// away): from the waiting queue or the running batch, its KV blocks freed, as
// vLLM aborts a request whose connection closed. It reports whether s was in
// the model; a finished request, or one of a closed engine, is not. The
// gauges show the abort at once between steps; during a step (the request
// may be in the batch the model is computing), at the step's end, as vLLM
// applies aborts between steps.
func (e *engine) abort(s *stream) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.streams[s.req.ID] != s {
		return false
	}
	delete(e.streams, s.req.ID)
	e.rep.Abort(&s.req)
	e.aborted.Add(1)
	if !e.rep.InStep() {
		e.metrics = e.rep.Live()
	}
	return true
}

// shutdown wakes every stream still in the model; their handlers see the
// engine closed and end the response.
func (e *engine) shutdown() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, s := range e.streams {
		delete(e.streams, id)
		s.wake()
	}
}

// next blocks until s has more than have tokens, has finished, the engine
// closed or ctx ended. It returns the token count and whether s finished.
func (e *engine) next(ctx context.Context, s *stream, have int) (int, bool, error) {
	for {
		n := int(s.generated.Load())
		fin := s.finished.Load()
		if n > have || fin {
			return n, fin, nil
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return n, false, ctx.Err()
		case <-e.closed:
			return n, false, ErrClosed
		}
	}
}

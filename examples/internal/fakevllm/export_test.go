package fakevllm

// Queued is one request in the model as the tests see it.
type Queued struct {
	Priority  int // the request's vLLM priority
	Generated int // output tokens the model has sampled for it
}

// Queues returns the model's running set and its waiting queue in the order
// the scheduler will admit from it, under the engine's lock: a consistent
// view between two steps, so that the tests can assert on the model's state
// rather than on wall-clock timing.
func (s *Server) Queues() (running, waiting []Queued) {
	e := s.eng
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, q := range e.rep.Running() {
		running = append(running, Queued{q.Priority, q.Generated()})
	}
	for _, q := range e.rep.Waiting(nil) {
		waiting = append(waiting, Queued{q.Priority, q.Generated()})
	}
	return running, waiting
}

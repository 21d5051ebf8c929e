package cluster

import "github.com/flowgate/flowgate/examples/internal/vllm"

// signalState is what the simulator keeps beyond vLLM's gauges for the
// anticipating saturation signal (saturation.Scorer.Projection) and the
// step-time bound: per replica the sums vLLM's vllm:request_prompt_tokens and
// vllm:request_generation_tokens histograms export (_sum and _count of the
// requests it finished), and the window's step statistics.
type signalState struct {
	done              []float64
	prompt, generated []float64
	steps             StepStats
}

func (st *signalState) init(replicas int) {
	st.done = make([]float64, replicas)
	st.prompt = make([]float64, replicas)
	st.generated = make([]float64, replicas)
}

// finished counts request q's lengths on replica r, as vLLM observes a
// finished request into its histograms.
func (st *signalState) finished(r int, q *vllm.Request) {
	st.done[r]++
	st.prompt[r] += float64(q.Input)
	st.generated[r] += float64(q.Output)
}

// means returns replica r's mean prompt and output lengths so far (0, 0 before
// its first completion: unknown).
func (st *signalState) means(r int) (prompt, output float64) {
	if st.done[r] == 0 {
		return 0, 0
	}
	return st.prompt[r] / st.done[r], st.generated[r] / st.done[r]
}

// stats returns the window's step statistics with their rate per replica.
func (st *signalState) stats(s *sim) StepStats {
	out := st.steps
	if w := float64(s.window) / 1e9 * float64(len(s.replicas)); w > 0 {
		out.Rate = out.SumB / w
	}
	return out
}

package vllm_test

import (
	"fmt"

	"github.com/flowgate/flowgate/examples/internal/vllm"
)

// A 20,000-token prompt is prefilled in chunks of the 8,192-token budget; the step that
// completes it samples the first token, and each later step decodes one more.
func ExampleReplica() {
	r, _ := vllm.New(vllm.DefaultConfig())
	_ = r.Add(&vllm.Request{ID: 1, Input: 20000, Output: 2})
	for r.HasWork() {
		d, events, _ := r.Step(nil)
		b := r.LastBatch()
		fmt.Printf("prefill %5d decode %d  %v", b.PrefillTokens, b.DecodeTokens, d)
		for _, e := range events {
			switch e.Kind {
			case vllm.FirstToken:
				fmt.Print("  first token")
			case vllm.Finished:
				fmt.Print("  finished")
			}
		}
		m := r.Metrics()
		fmt.Printf("  waiting %d running %d kv %.4f\n", m.Waiting, m.Running, m.KVCacheUsage)
	}
	// Output:
	// prefill  8192 decode 0  595.68256ms  waiting 0 running 1 kv 0.0322
	// prefill  8192 decode 0  596.13312ms  waiting 0 running 1 kv 0.0644
	// prefill  3616 decode 0  271.436ms  first token  waiting 0 running 1 kv 0.0786
	// prefill     0 decode 1  14.748055ms  finished  waiting 0 running 0 kv 0.0000
}

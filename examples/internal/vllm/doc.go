// Package vllm is a clock-free, deterministic model of a vLLM engine serving one model on one GPU: continuous batching, chunked prefill, paged KV cache, recompute preemption and the exported gauges.
package vllm

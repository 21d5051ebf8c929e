// Package workload generates the published open-loop workloads (codegen, chat, reasoning): Poisson arrivals with log-normal token lengths, seeded and deterministic.
package workload

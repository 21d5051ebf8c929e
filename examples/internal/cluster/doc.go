// Package cluster runs one simulated experiment: open-loop workload, N gateways each with a real flowcontrol.Dispatcher on virtual time, and a pool of vLLM replica models.
package cluster

// Package saturation provides sources of backend-pool saturation: settable values, combinators, smoothing, in-flight counters and a Prometheus metrics poller.
package saturation

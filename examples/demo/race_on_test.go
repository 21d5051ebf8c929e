//go:build race

package main

// raceEnabled: the race detector is on, so the proxy's own path runs several
// times slower than it ships and wall-clock latency claims do not hold.
const raceEnabled = true

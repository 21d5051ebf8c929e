//go:build !race

package gateway

// raceEnabled: the race detector is on (sync.Pool then drops items at
// random, so pooled paths allocate).
const raceEnabled = false

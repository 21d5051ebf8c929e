//go:build !race

package main

// raceEnabled shortens the end-to-end load under the race detector, which
// slows the in-process client and fake backends several times.
const raceEnabled = false

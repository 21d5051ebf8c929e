//go:build !race

package saturation

const raceSlowdown = 1

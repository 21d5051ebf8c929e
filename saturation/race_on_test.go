//go:build race

package saturation

// raceSlowdown: the race detector slows parsing and HTTP several times over;
// timing-bound tests widen their bounds by this much.
const raceSlowdown = 10

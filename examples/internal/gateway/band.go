package gateway

import "github.com/flowgate/flowgate/flowcontrol/flowhttp"

// The objective headers the proxy reads (flowhttp's): llm-d's, and the
// Gateway API Inference Extension's legacy name.
const (
	ObjectiveHeader       = flowhttp.ObjectiveHeader
	LegacyObjectiveHeader = flowhttp.LegacyObjectiveHeader
)

// A request's band is found by flowhttp (see its package documentation):
// the objective header if it names a known objective (Config.Objectives),
// else vLLM's body field "priority" (lower is more urgent; clamped to the
// bands) unless bodyPriority is ignore, else the default band.

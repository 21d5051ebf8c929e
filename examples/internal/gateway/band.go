package gateway

import "github.com/flowgate/flowgate/flowcontrol/flowhttp"

// The objective headers the proxy reads (flowhttp's): llm-d's, and the
// Gateway API Inference Extension's legacy name.
const (
	ObjectiveHeader       = flowhttp.ObjectiveHeader
	LegacyObjectiveHeader = flowhttp.LegacyObjectiveHeader
)

// A request's band is found by flowhttp (see its package documentation):
// what it asks (the objective header if it names a known objective,
// Config.Objectives, else vLLM's body field "priority", lower is more
// urgent, unless bodyPriority is ignore), never above its ceiling: its API
// key's tenant's (Options.APIKeys), else the default band, or with
// Options.TrustObjectiveHeader the header's.

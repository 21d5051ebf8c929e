package flowhttp_test

import "github.com/flowgate/flowgate/flowcontrol/flowhttp"

// trustHeader is o trusting the objective header.
func trustHeader(o flowhttp.Options) flowhttp.Options {
	o.TrustObjectiveHeader = true
	return o
}

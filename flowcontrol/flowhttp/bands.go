package flowhttp

import (
	"fmt"

	"github.com/flowgate/flowgate/flowcontrol"
)

// band is what the handler knows of one of the controller's bands.
type band struct {
	name     string
	maxBytes int64 // 0: no byte budget
}

// bandsOf is the one place that reads the controller's band configuration.
// Until flowcontrol exposes Controller.Bands, names and byte budgets come from
// Options (BandNames, MaxBytes); the number of bands from Stats.
func bandsOf(c *flowcontrol.Controller, opts *Options) []band {
	n := len(c.Stats().Bands)
	out := make([]band, n)
	for i := range out {
		out[i].name = fmt.Sprintf("band%d", i)
		if i < len(opts.BandNames) && opts.BandNames[i] != "" {
			out[i].name = opts.BandNames[i]
		}
		if i < len(opts.MaxBytes) {
			out[i].maxBytes = opts.MaxBytes[i]
		}
	}
	return out
}

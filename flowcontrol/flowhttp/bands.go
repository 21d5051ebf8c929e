package flowhttp

import "github.com/flowgate/flowgate/flowcontrol"

// band is what the handler knows of one of the controller's bands.
type band struct {
	name     string
	maxBytes int64 // 0: no byte budget
	flows    bool  // the band has fairness: requests go in with their fairness id (WaitRequest)
}

// bandsOf is the one place that reads the controller's band configuration:
// names (for the objective map, BandHeader and messages) and byte budgets.
func bandsOf(c *flowcontrol.Controller) []band {
	cfgs := c.Bands()
	out := make([]band, len(cfgs))
	for i, b := range cfgs {
		out[i] = band{name: b.Name, maxBytes: b.MaxBytes,
			flows: b.Fairness != "" && b.Fairness != flowcontrol.FairnessFCFS}
	}
	return out
}

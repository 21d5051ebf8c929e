package gateway

import "testing"

func TestConfigEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "abc", 3}, {"abc", "", 3}, {"abc", "abc", 0},
		{"capasity", "capacity", 1},                         // substitution
		{"treshold", "threshold", 1},                        // insertion
		{"maxRequestss", "maxRequests", 1},                  // deletion
		{"kvcahceutilthreshold", "kvcacheutilthreshold", 1}, // adjacent swap
		{"kitten", "sitting", 3},
		{"ca", "abc", 3}, // optimal string alignment: no edit of a swapped pair
		{"tick", "ttl", 3},
		{"bänd", "band", 1}, // runes, not bytes
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := editDistance(tc.b, tc.a); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d (symmetry)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestConfigNearestKey(t *testing.T) {
	detector := []string{"queueDepthThreshold", "kvCacheUtilThreshold", "metricsStalenessThreshold", "scrapeInterval", "inFlightCredit", "engine"}
	for _, tc := range []struct{ key, want string }{
		{"queueDepthTreshold", "queueDepthThreshold"},
		{"queuedepththreshold", "queueDepthThreshold"}, // case only
		{"kvCahceUtilThreshold", "kvCacheUtilThreshold"},
		{"kvCacheThreshold", "kvCacheUtilThreshold"}, // 4 edits in 16 runes
		{"metricStalenessThreshold", "metricsStalenessThreshold"},
		{"scrapeIntervall", "scrapeInterval"},
		{"engin", "engine"},
		{"queueDepth", ""},     // 9 edits: not a misspelling
		{"threshold", ""},      // nearest is 11 edits away
		{"engineer", "engine"}, // 2 edits in 8 runes: a quarter
		{"engineVersion", ""},  // 7 edits in 13 runes: too far
		{"", ""},
		{"x", ""},
	} {
		if got := nearestKey(tc.key, detector); got != tc.want {
			t.Errorf("nearestKey(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
	// Ties go to the earlier key.
	if got := nearestKey("ab", []string{"xb", "ax"}); got != "xb" {
		t.Errorf("tie: %q, want xb", got)
	}
}

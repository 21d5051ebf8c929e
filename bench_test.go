// Benchmarks for flowgate, one file so that a single run compares each
// component with its baseline on the same machine at the same moment:
//
//	go test -run '^$' -bench . -benchmem -count=6 . | tee new.txt
//	go run golang.org/x/perf/cmd/benchstat@latest new.txt
package flowgate_test

// ---- queue (issue: ring queue) ----

// ---- flowcontrol ----

// ---- saturation ----

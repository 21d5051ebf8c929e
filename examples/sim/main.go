// Command sim runs the deterministic vLLM-pool simulator with the library's dispatchers
// in the loop. With no flags it answers whether flowgate protects critical traffic, at
// what price and against what: at every overloaded published point and codegen@10, over
// 5 seeds, it runs no flow control, llm-d parity (package flowcontrol/llmd: llm-d's
// static and soft-reflective policies), flowgate's soft-reflective policy as
// flowhttp.Gateway ships it, the same with eviction (flowcontrol.Evictor) and the
// critical-only floor, and prints a few sentences, one table and the eviction's table
// with its price. -full runs the whole grid (every published point, flowgate's static,
// rows with backend priority, no gate with eviction) and prints every figure; -format json writes JSON Lines (one
// object per workload, qps, policy, seed); -fit prints the calibration fit. See
// README.md next to this file.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "sim:", err)
		os.Exit(2)
	}
}

// run is main without the process: tests call it twice and compare the bytes.
func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: the usage went to stderr; exit 0
	}
	if err != nil {
		return err
	}
	if o.fit {
		return runFit(o, stdout, stderr)
	}
	if o.sweep {
		return runSweep(o, stdout, stderr)
	}
	results, err := runAll(o, stderr)
	if err != nil {
		return err
	}
	switch o.format {
	case "json":
		err = writeJSON(stdout, results)
	case "table":
		err = writeTable(stdout, o, results)
	default:
		err = writeSummary(stdout, o, results)
	}
	if err != nil {
		return err
	}
	if o.plot != "" {
		f, err := os.Create(o.plot)
		if err != nil {
			return err
		}
		if err := writeSVG(f, o, results); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	return nil
}

// Command sim runs the deterministic vLLM-pool simulator with the library's dispatchers
// in the loop and compares, at every published workload and QPS point over several
// seeds, no flow control, llm-d parity (package flowcontrol/llmd: llmd.Dispatcher with
// llm-d's static and soft-reflective policies), flowgate's static and soft-reflective policies and the
// critical-only floor. -format json writes JSON Lines (one object per workload, qps,
// policy, seed); -fit prints the calibration fit. See README.md next to this file.
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
	default:
		err = writeTable(stdout, o, results)
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

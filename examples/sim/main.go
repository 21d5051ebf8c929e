// Command sim runs the deterministic vLLM-pool simulator with the real flowcontrol
// dispatcher in the loop and compares the static baseline with the soft-reflective
// ceiling on the published workloads. See the README's Simulator section.
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

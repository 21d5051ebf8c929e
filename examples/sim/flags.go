package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/flowgate/flowgate/examples/internal/cluster"
	"github.com/flowgate/flowgate/examples/internal/vllm"
	"github.com/flowgate/flowgate/examples/internal/workload"
)

// options are the parsed command line.
type options struct {
	workloads   []workload.Workload
	qps         []float64 // nil = each workload's published points
	policies    []string
	duration    time.Duration
	seed        uint64
	format      string
	gateways    int
	plot        string
	tick        time.Duration
	burst       int
	credit      bool
	scrape      time.Duration
	replicas    int
	cv          float64
	step        vllm.StepModel
	parallel    int
	sweep       bool
	sweepQPS    string
	sweepTicks  string
	sweepBursts string
	quiet       bool
}

// DefaultCredit is the simulator's saturation wiring: whether the gateway adds its
// dispatched-but-not-yet-visible requests to each pod's waiting count (chosen by the
// sweep; see the README).
const DefaultCredit = false

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wl := fs.String("workload", "all", "workload: codegen, chat, reasoning or all")
	qps := fs.String("qps", "", "comma-separated request rates (default: the published points of each workload)")
	pol := fs.String("policy", "both", "policy: static, soft-reflective or both")
	fs.DurationVar(&o.duration, "duration", 10*time.Minute, "arrival window (the pool then drains)")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed (same seed, same output)")
	fs.StringVar(&o.format, "format", "table", "output: table (Markdown) or json (one object per line)")
	fs.IntVar(&o.gateways, "gateways", 1, "independent gateways (dispatchers) sharing the pool, each with 1/N of the traffic")
	fs.StringVar(&o.plot, "plot", "", "write an SVG chart of the changes (soft-reflective vs static) to this file")
	fs.DurationVar(&o.tick, "tick", 0, "dispatcher tick (0 = flowcontrol.DefaultTick)")
	fs.IntVar(&o.burst, "burst", 0, "items an open band releases per tick (0 = flowcontrol.DefaultBurst)")
	fs.BoolVar(&o.credit, "credit", DefaultCredit, "count each gateway's in-flight requests not yet in the scraped metrics as waiting")
	fs.DurationVar(&o.scrape, "scrape", 50*time.Millisecond, "metrics scrape interval")
	fs.IntVar(&o.replicas, "replicas", 2, "vLLM replicas in the pool")
	fs.Float64Var(&o.cv, "cv", workload.DefaultCV, "coefficient of variation of token lengths (log-normal; 0 = constant)")
	def := vllm.DefaultStepModel()
	base := fs.Duration("step-base", def.Base, "step model: fixed cost per step")
	fs.Float64Var(&o.step.PrefillNs, "step-prefill-ns", def.PrefillNs, "step model: ns per prefill token")
	fs.Float64Var(&o.step.DecodeNs, "step-decode-ns", def.DecodeNs, "step model: ns per decode token")
	fs.Float64Var(&o.step.ContextNs, "step-context-ns", def.ContextNs, "step model: ns per context token read")
	admit := fs.Duration("step-admit", def.PerAdmit, "step model: cost per request admitted in a step")
	fs.IntVar(&o.parallel, "parallel", 0, "experiments run concurrently (0 = GOMAXPROCS); output does not depend on it")
	fs.BoolVar(&o.sweep, "sweep", false, "run the Tick × Burst × credit sweep used to choose flowgate's defaults")
	fs.StringVar(&o.sweepQPS, "sweep-points", "codegen:4,codegen:16,chat:20,chat:80,reasoning:0.2,reasoning:0.7", "sweep: workload:qps points")
	fs.StringVar(&o.sweepTicks, "sweep-ticks", "", "sweep: comma-separated ticks (default 1ms,5ms,10ms,50ms)")
	fs.StringVar(&o.sweepBursts, "sweep-bursts", "", "sweep: comma-separated bursts (default 1,4,32)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress on stderr")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.step.Base, o.step.PerAdmit = *base, *admit
	if *wl == "all" {
		o.workloads = workload.All()
	} else {
		w, err := workload.ByName(*wl)
		if err != nil {
			return o, fmt.Errorf("-workload: %w", err)
		}
		o.workloads = []workload.Workload{w}
	}
	if *qps != "" {
		for _, f := range strings.Split(*qps, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return o, fmt.Errorf("-qps: %q is not a positive number", f)
			}
			o.qps = append(o.qps, v)
		}
	}
	switch *pol {
	case "both":
		o.policies = []string{cluster.Static, cluster.SoftReflective}
	case cluster.Static, cluster.SoftReflective:
		o.policies = []string{*pol}
	default:
		return o, fmt.Errorf("-policy: %q must be static, soft-reflective or both", *pol)
	}
	if o.format != "table" && o.format != "json" {
		return o, fmt.Errorf("-format: %q must be table or json", o.format)
	}
	switch {
	case o.duration <= 0:
		return o, errors.New("-duration must be > 0")
	case o.gateways < 1:
		return o, errors.New("-gateways must be >= 1")
	case o.tick < 0:
		return o, errors.New("-tick must be >= 0")
	case o.burst < 0:
		return o, errors.New("-burst must be >= 0")
	case o.scrape <= 0:
		return o, errors.New("-scrape must be > 0")
	case o.replicas < 1:
		return o, errors.New("-replicas must be >= 1")
	case !(o.cv >= 0):
		return o, errors.New("-cv must be >= 0")
	case o.parallel < 0:
		return o, errors.New("-parallel must be >= 0")
	}
	rc := vllm.DefaultConfig()
	rc.Step = o.step
	if err := rc.Validate(); err != nil {
		return o, fmt.Errorf("step model: %w", err)
	}
	return o, nil
}

// config builds one experiment's configuration from the options.
func (o options) config(w workload.Workload, qps float64, policy string) cluster.Config {
	rc := vllm.DefaultConfig()
	rc.Step = o.step
	return cluster.Config{
		Workload: w, QPS: qps, Policy: policy, Duration: o.duration, Seed: o.seed,
		Replicas: o.replicas, Gateways: o.gateways, Tick: o.tick, Burst: o.burst,
		Credit: o.credit, Scrape: o.scrape, CV: o.cv, Replica: rc,
	}
}

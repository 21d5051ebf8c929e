package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/flowgate/flowgate/examples/internal/gateway"
)

func main() {
	configPath := flag.String("config", "", "optional proxy YAML configuration (see examples/proxy/config.yaml)")
	qps := flag.Float64("qps", demoLoad().QPS, "arrival rate in model time (codegen mix)")
	speedUp := flag.Float64("speedup", demoLoad().SpeedUp, "the fake backends run the model this many times faster than real time")
	duration := flag.Duration("duration", demoLoad().Duration, "wall-clock duration of the load per policy")
	compare := flag.Int("compare", 0, "instead: run this many interleaved rounds of the same load through examples/proxy, examples/embed and examples/embed -no-credit, each built and run as its own process at its defaults")
	watch := flag.Bool("watch", false, "instead: watch protection happen: one overloaded minute (-qps 18 and -duration 60s by default here) through the proxy at its defaults, a live line a second, then a summary")
	contrast := flag.String("contrast", "", "with -watch: then the same load again with `none` (no flow control) or static (the constant ceiling 1.0), for contrast")
	evict := flag.Int("evict", 0, "instead: run this many interleaved rounds of a reasoning load (-qps 0.7, -speedup 10, -duration 30s by default here; sheddable not streamed) through the proxy with soft-reflective, eviction off and on (flowControl.enableEviction), and print critical TTFT p99, the evictions and every client's outcome")
	backendPrio := flag.Bool("backend-priority", false, "also run each policy with backend priority: the fake servers schedule by priority (vLLM --scheduling-policy priority) and the proxy writes the band into each body (bodyPriority: set)")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *watch && (set["config"] || set["compare"] || set["backend-priority"]) {
		fatal(errors.New("demo: -watch runs the proxy at its defaults, alone: -config, -compare and -backend-priority do not apply"))
	}
	if *evict > 0 && (*watch || set["compare"] || set["backend-priority"]) {
		fatal(errors.New("demo: -evict runs alone: -watch, -compare and -backend-priority do not apply"))
	}
	if *contrast != "" && !*watch {
		fatal(errors.New("demo: -contrast goes with -watch"))
	}

	cfg := gateway.DefaultConfig()
	// Compare the policies as the published experiment did: the reference
	// saturation formula without in-flight credit (credit strengthens the
	// static baseline too). -config overrides.
	cfg.Saturation.InFlightCredit = false
	if *configPath != "" {
		var err error
		if cfg, err = gateway.LoadConfig(*configPath); err != nil {
			fatal(err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	load := demoLoad()
	load.QPS, load.SpeedUp, load.Duration = *qps, *speedUp, *duration
	if *watch {
		// One Ctrl-C stops gracefully (the summary of what was measured
		// is printed); a second one, with the default behaviour back,
		// kills.
		context.AfterFunc(ctx, stop)
		wl := watchLoad() // its own defaults, unless the flags are given
		if set["qps"] {
			wl.QPS = *qps
		}
		if set["speedup"] {
			wl.SpeedUp = *speedUp
		}
		if set["duration"] {
			wl.Duration = *duration
		}
		if _, err := RunWatch(ctx, WatchSpec{Backends: 2, Load: wl, Contrast: *contrast, Out: os.Stdout}); err != nil {
			fatal(err)
		}
		return
	}
	if *evict > 0 {
		el := evictLoad() // its own defaults, unless the flags are given
		if set["qps"] {
			el.QPS = *qps
		}
		if set["speedup"] {
			el.SpeedUp = *speedUp
		}
		if set["duration"] {
			el.Duration = *duration
		}
		// The proxy at its defaults (in-flight credit on, as the
		// simulator's flowgate rows), unless -config.
		ecfg := gateway.DefaultConfig()
		if *configPath != "" {
			ecfg = cfg
		}
		if _, err := RunEvict(ctx, EvictSpec{Rounds: *evict, Demo: DemoSpec{Config: ecfg, Backends: 2, Load: el, Out: os.Stdout}}); err != nil {
			fatal(err)
		}
		return
	}
	if *compare > 0 {
		if _, err := RunCompare(ctx, CompareSpec{Rounds: *compare, Backends: 2, Load: load, Out: os.Stdout}); err != nil {
			fatal(err)
		}
		return
	}
	if _, err := RunDemo(ctx, DemoSpec{Config: cfg, Backends: 2, Load: load, Out: os.Stdout, BackendPriority: *backendPrio}); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

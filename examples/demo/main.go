package main

import (
	"context"
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
	flag.Parse()

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
	if _, err := RunDemo(ctx, DemoSpec{Config: cfg, Backends: 2, Load: load, Out: os.Stdout}); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

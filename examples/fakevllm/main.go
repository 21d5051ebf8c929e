// Command fakevllm serves an OpenAI-compatible API whose token timing comes from the simulator's vLLM replica model, in real time.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8001", "listen address")
	speedUp := flag.Float64("speedup", 1, "model seconds per wall-clock second (10 = ten times faster than the modelled H100)")
	model := flag.String("model", "Qwen/Qwen3-14B", "model name served")
	// vLLM's flag and values, so that a command line written for vLLM reads the same here.
	policy := flag.String("scheduling-policy", fakevllm.PolicyFCFS,
		"vLLM's scheduling policy: fcfs (arrival order; a request whose \"priority\" is not 0 is refused with 400) or priority (waiting queue by (priority, arrival), lower first; the least urgent running request is preempted)")
	flag.Parse()
	if *policy != fakevllm.PolicyFCFS && *policy != fakevllm.PolicyPriority {
		log.Fatalf("fakevllm: --scheduling-policy must be fcfs or priority, got %q", *policy)
	}
	s, err := fakevllm.New(fakevllm.Config{SpeedUp: *speedUp, Model: *model, SchedulingPolicy: *policy})
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *addr, Handler: s, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // let streams finish
		s.Close()
	}()
	log.Printf("fakevllm: serving %s on http://%s (speed-up %gx, scheduling policy %s): /v1/completions, /v1/chat/completions, /metrics", *model, *addr, *speedUp, *policy)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
	<-ctx.Done()
}

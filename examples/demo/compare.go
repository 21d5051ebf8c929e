package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/flowgate/flowgate/examples/internal/fakevllm"
)

// CompareSpec configures RunCompare: the same load through several gateway
// programs, each its own process in front of fresh fake backends, in
// interleaved rounds.
type CompareSpec struct {
	Rounds   int
	Backends int
	Load     LoadSpec
	Out      io.Writer
}

// gatewayProgram is one of the programs compared.
type gatewayProgram struct {
	name string
	pkg  string // package to build
	args []string
}

// comparedPrograms: the example proxy at its defaults, the README's embed
// program (public API only), and the embed program without the credit.
var comparedPrograms = []gatewayProgram{
	{"examples/proxy", "github.com/flowgate/flowgate/examples/proxy", nil},
	{"examples/embed", "github.com/flowgate/flowgate/examples/embed", nil},
	{"examples/embed -no-credit", "github.com/flowgate/flowgate/examples/embed", []string{"-no-credit"}},
}

// CompareRound is one program's run in one round.
type CompareRound struct {
	Program        string
	Round          int
	CriticalP99    time.Duration
	SheddableP99   time.Duration
	Completed      int
	Wall           time.Duration
	Lost           float64
	CriticalStatus map[int]int
}

// RunCompare builds the programs, then runs Rounds rounds; in each round
// every program serves the same load (same seed) in front of fresh fake
// backends, in an order that rotates by round so that no program always
// runs first or last on a machine whose load drifts.
func RunCompare(ctx context.Context, spec CompareSpec) ([]CompareRound, error) {
	out := spec.Out
	if out == nil {
		out = io.Discard
	}
	dir, err := os.MkdirTemp("", "flowgate-compare-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bins := map[string]string{}
	for _, p := range comparedPrograms {
		if bins[p.pkg] != "" {
			continue
		}
		bin := filepath.Join(dir, filepath.Base(p.pkg))
		if b, err := exec.CommandContext(ctx, "go", "build", "-o", bin, p.pkg).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("demo: go build %s: %v\n%s", p.pkg, err, b)
		}
		bins[p.pkg] = bin
	}
	fmt.Fprintf(out, "flowgate gateway comparison: %d fake vLLM backends at %gx, %s at %g QPS (model time), %v per run, %d rounds; every gateway at its defaults\n",
		spec.Backends, spec.Load.SpeedUp, spec.Load.Workload.Name, spec.Load.QPS, spec.Load.Duration, spec.Rounds)
	var rounds []CompareRound
	n := len(comparedPrograms)
	for r := range spec.Rounds {
		for k := range n {
			p := comparedPrograms[(r+k)%n]
			res, err := runProgram(ctx, spec, bins[p.pkg], p, r+1)
			if err != nil {
				return rounds, fmt.Errorf("demo: %s, round %d: %w", p.name, r+1, err)
			}
			fmt.Fprintf(out, "  round %d %-26s critical TTFT p99 %7s  sheddable TTFT p99 %8s  completed %5d  critical %v  lost %.0f %%\n",
				res.Round, res.Program, ms(res.CriticalP99), ms(res.SheddableP99), res.Completed, res.CriticalStatus, 100*res.Lost)
			rounds = append(rounds, res)
		}
	}
	printCompare(out, rounds)
	return rounds, nil
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func runProgram(ctx context.Context, spec CompareSpec, bin string, p gatewayProgram, round int) (CompareRound, error) {
	res := CompareRound{Program: p.name, Round: round}
	var urls []string
	var fakes []*fakevllm.Server
	var servers []*http.Server
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
		for _, f := range fakes {
			f.Close()
		}
	}()
	for range spec.Backends {
		f, err := fakevllm.New(fakevllm.Config{SpeedUp: spec.Load.SpeedUp})
		if err != nil {
			return res, err
		}
		fakes = append(fakes, f)
		srv, url, err := listen(nil, f)
		if err != nil {
			return res, err
		}
		servers = append(servers, srv)
		urls = append(urls, url)
	}
	addr, err := freeAddr()
	if err != nil {
		return res, err
	}
	cmd := exec.Command(bin, append([]string{"-addr", addr, "-backends", strings.Join(urls, ",")}, p.args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return res, err
	}
	if err := cmd.Start(); err != nil {
		return res, err
	}
	var logs strings.Builder
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
		}
	}()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		<-logged
	}()
	// Ready when it accepts connections (bounded).
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return res, errors.New("did not listen within 30 s:\n" + logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Let the gateway scrape the idle backends once before the load.
	time.Sleep(200 * time.Millisecond)
	client := newClient(nil)
	defer client.CloseIdleConnections()
	load, err := RunLoad(ctx, client, "http://"+addr+"/v1/completions", spec.Load, nil)
	if err != nil {
		return res, err
	}
	res.CriticalP99 = quantile(load.Critical.TTFT, 0.99)
	res.SheddableP99 = quantile(load.Sheddable.TTFT, 0.99)
	res.Completed = load.Critical.Completed + load.Sheddable.Completed
	res.Wall = load.Wall
	res.CriticalStatus = load.Critical.Status
	for _, f := range fakes {
		res.Lost = max(res.Lost, f.Lost().Seconds()/load.Wall.Seconds())
	}
	return res, nil
}

// medianRange formats the median and the range of ds.
func medianRange(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n/a"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%s (%s–%s)", ms(s[len(s)/2]), ms(s[0]), ms(s[len(s)-1]))
}

func printCompare(out io.Writer, rounds []CompareRound) {
	by := map[string][]CompareRound{}
	for _, r := range rounds {
		by[r.Program] = append(by[r.Program], r)
	}
	base := map[int]time.Duration{}
	for _, r := range by[comparedPrograms[0].name] {
		base[r.Round] = r.CriticalP99
	}
	fmt.Fprintf(out, "\nTTFT p99 measured by the HTTP client (wall clock), median of the rounds (min–max)\n\n")
	fmt.Fprintf(out, "| program | critical TTFT p99 | ratio to examples/proxy, same round | sheddable TTFT p99 | completed |\n| --- | --- | --- | --- | --- |\n")
	for _, p := range comparedPrograms {
		rs := by[p.name]
		var crit, shed []time.Duration
		var ratios []float64
		var done []int
		for _, r := range rs {
			crit = append(crit, r.CriticalP99)
			shed = append(shed, r.SheddableP99)
			done = append(done, r.Completed)
			if b := base[r.Round]; b > 0 {
				ratios = append(ratios, float64(r.CriticalP99)/float64(b))
			}
		}
		slices.Sort(ratios)
		slices.Sort(done)
		ratio := "n/a"
		if len(ratios) > 0 {
			ratio = fmt.Sprintf("%.2f× (%.2f–%.2f)", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s | %d (%d–%d) |\n", p.name, medianRange(crit), ratio, medianRange(shed),
			done[len(done)/2], done[0], done[len(done)-1])
	}
}

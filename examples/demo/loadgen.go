package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowgate/flowgate/examples/internal/gateway"
	"github.com/flowgate/flowgate/examples/internal/workload"
)

// LoadSpec is an open-loop Poisson load: arrivals do not wait for earlier
// responses, as in the published experiment.
type LoadSpec struct {
	Workload workload.Workload
	// QPS is the arrival rate in model time; the wall-clock rate is
	// QPS·SpeedUp, matching backends that run the model SpeedUp× fast.
	QPS     float64
	SpeedUp float64
	// Duration is how long (wall clock) arrivals go on.
	Duration time.Duration
	// CV is the coefficient of variation of the token lengths.
	CV   float64
	Seed uint64
	// Drain bounds how long (wall clock) the generator waits for responses
	// after the last arrival; requests still open then are cancelled and
	// counted as such.
	Drain time.Duration
	// PlainSheddable sends sheddable requests without streaming: their
	// TTFT is then not measured (E2E is), and the run costs far less CPU
	// (no per-token events), which keeps a loaded test machine from
	// slowing the real-time backends.
	PlainSheddable bool
	// FirstToken, if set, is called from the request's goroutine when a
	// streamed request reads its first token, with its class and TTFT
	// (the watch mode's live view).
	FirstToken func(critical bool, ttft time.Duration)
	// Done, if set, is called from the request's goroutine when a request
	// has ended, with its class and HTTP status (0: no response).
	Done func(critical bool, status int)
}

// ClassResult is what one class of requests (critical or sheddable) saw.
type ClassResult struct {
	Sent    int
	Status  map[int]int    // HTTP status → count
	Reasons map[string]int // x-flowgate-reason of refused requests
	Errors  int            // transport errors: no response at all
	// Abandoned counts requests the client itself gave up on before any
	// response came (the drain bound or Ctrl-C): no response, by the
	// client's choice.
	Abandoned int
	// Cut counts 200 answers that ended before their last token (a stream
	// without [DONE], an unreadable body) from the server's side.
	Cut int
	// Stopped counts 200 answers the client itself cut off mid-answer:
	// still streaming when it stopped waiting (the drain bound or Ctrl-C).
	Stopped int
	// Completed counts 200 responses read to the end.
	Completed int
	TTFT      []time.Duration // streamed requests only
	E2E       []time.Duration // every completed request
	statusMu  sync.Mutex
}

// Answered counts requests that received any HTTP response.
func (c *ClassResult) Answered() int {
	n := 0
	for _, v := range c.Status {
		n += v
	}
	return n
}

// LoadResult holds both classes.
type LoadResult struct {
	Critical, Sheddable ClassResult
	Wall                time.Duration
}

// quantile returns the q-quantile (nearest rank) of ds, 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// RunLoad sends spec's arrivals to target (the proxy's /v1/completions URL)
// with streaming on, and measures TTFT (request sent → first SSE event
// read) and E2E (→ [DONE]) on the client side. progress, if set, is called
// about once a second with the requests sent and finished so far.
func RunLoad(ctx context.Context, client *http.Client, target string, spec LoadSpec, progress func(sent, finished int)) (*LoadResult, error) {
	if spec.SpeedUp <= 0 {
		spec.SpeedUp = 1
	}
	gen, err := workload.NewGenerator(spec.Workload, spec.QPS, spec.CV, spec.Seed, 7)
	if err != nil {
		return nil, err
	}
	res := &LoadResult{}
	for _, c := range []*ClassResult{&res.Critical, &res.Sheddable} {
		c.Status, c.Reasons = map[int]int{}, map[string]int{}
	}
	// One prompt buffer; requests slice it (4 bytes per token, as the fake
	// server counts them).
	maxIn := int(4 * spec.Workload.InputMean)
	prompt := strings.Repeat("abcd", maxIn)

	reqCtx, cancelReqs := context.WithCancel(ctx)
	defer cancelReqs()
	var wg sync.WaitGroup
	var finished atomic.Int64
	start := time.Now()
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	timer := time.NewTimer(0)
	defer timer.Stop()
	sent := 0
arrivals:
	for {
		a := gen.Next()
		at := time.Duration(float64(a.At) / spec.SpeedUp)
		if at > spec.Duration {
			break
		}
		for {
			wait := time.Until(start.Add(at))
			if wait <= 0 {
				break
			}
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break arrivals
			case <-ticker.C:
				if progress != nil {
					progress(sent, int(finished.Load()))
				}
				continue
			case <-timer.C:
			}
			break
		}
		cls, objective := &res.Sheddable, "sheddable"
		if a.Critical {
			cls, objective = &res.Critical, "critical"
		}
		cls.statusMu.Lock()
		cls.Sent++
		cls.statusMu.Unlock()
		sent++
		in := min(a.Input, maxIn)
		stream := a.Critical || !spec.PlainSheddable
		body := `{"model":"demo","prompt":"` + prompt[:4*in] + `","max_tokens":` + strconv.Itoa(a.Output) + `,"stream":` + strconv.FormatBool(stream) + `}`
		critical := a.Critical
		var onFirst func(time.Duration)
		if spec.FirstToken != nil {
			onFirst = func(ttft time.Duration) { spec.FirstToken(critical, ttft) }
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer finished.Add(1)
			status := one(reqCtx, client, target, objective, body, stream, cls, onFirst)
			if spec.Done != nil {
				spec.Done(critical, status)
			}
		}()
	}
	// Drain: wait for every response, cancelling what is left at the bound.
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	drain := time.NewTimer(spec.Drain)
	defer drain.Stop()
	done := ctx.Done()
wait:
	for {
		select {
		case <-allDone:
			break wait
		case <-ticker.C:
			if progress != nil {
				progress(sent, int(finished.Load()))
			}
		case <-drain.C:
			cancelReqs()
		case <-done:
			cancelReqs()
			done = nil // closed for good: selecting on it again would spin
		}
	}
	res.Wall = time.Since(start)
	if progress != nil {
		progress(sent, int(finished.Load()))
	}
	return res, nil
}

var (
	dataPrefix = []byte("data: ")
	doneEvent  = []byte("data: [DONE]")
)

// one sends a request, records its outcome in cls and returns its HTTP
// status (0: no response); onFirst, if set, is called when a stream's first
// token is read.
func one(ctx context.Context, client *http.Client, target, objective, body string, stream bool, cls *ClassResult, onFirst func(time.Duration)) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(body))
	if err != nil {
		cls.record(func() { cls.Errors++ })
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(gateway.ObjectiveHeader, objective)
	sentAt := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		cls.record(func() {
			if ctx.Err() != nil {
				cls.Abandoned++ // the client stopped waiting
			} else {
				cls.Errors++
			}
		})
		return 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		reason := resp.Header.Get(gateway.ReasonHeader)
		cls.record(func() {
			cls.Status[resp.StatusCode]++
			if reason != "" {
				cls.Reasons[reason]++
			}
		})
		return resp.StatusCode
	}
	if !stream {
		var out struct {
			Choices []json.RawMessage `json:"choices"`
		}
		err := json.NewDecoder(resp.Body).Decode(&out)
		e2e := time.Since(sentAt)
		cls.record(func() {
			cls.Status[http.StatusOK]++
			if err != nil || len(out.Choices) == 0 {
				cls.unfinished(ctx)
				return
			}
			cls.Completed++
			cls.E2E = append(cls.E2E, e2e)
		})
		return http.StatusOK
	}
	br := bufio.NewReaderSize(resp.Body, 4096)
	var ttft time.Duration
	complete := false
	for {
		line, err := br.ReadSlice('\n')
		if bytes.HasPrefix(line, dataPrefix) {
			if ttft == 0 {
				ttft = time.Since(sentAt)
				if onFirst != nil {
					onFirst(ttft)
				}
			}
			if bytes.HasPrefix(line, doneEvent) {
				complete = true
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			break
		}
	}
	e2e := time.Since(sentAt)
	cls.record(func() {
		cls.Status[http.StatusOK]++
		if !complete {
			cls.unfinished(ctx)
			return
		}
		cls.Completed++
		cls.TTFT = append(cls.TTFT, ttft)
		cls.E2E = append(cls.E2E, e2e)
	})
	return http.StatusOK
}

func (c *ClassResult) record(f func()) {
	c.statusMu.Lock()
	f()
	c.statusMu.Unlock()
}

// unfinished counts a 200 answer that ended before its last token: Stopped
// when the client had stopped waiting (ctx done), else Cut. Called under
// statusMu.
func (c *ClassResult) unfinished(ctx context.Context) {
	if ctx.Err() != nil {
		c.Stopped++
	} else {
		c.Cut++
	}
}

// summary is one line of counts, each saying what it counts: sent,
// completed, refused by status and reason, answers cut off by the client
// at the end or by the server, requests with no response.
func (c *ClassResult) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sent %d, completed %d", c.Sent, c.Completed)
	codes := make([]int, 0, len(c.Status))
	for code := range c.Status {
		if code != http.StatusOK {
			codes = append(codes, code)
		}
	}
	slices.Sort(codes)
	for _, code := range codes {
		fmt.Fprintf(&b, ", %d refused with %d", c.Status[code], code)
	}
	reasons := slices.Sorted(maps.Keys(c.Reasons))
	for i, r := range reasons {
		if i == 0 {
			b.WriteString(" (reason:")
		} else {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s %d", r, c.Reasons[r])
		if i == len(reasons)-1 {
			b.WriteString(")")
		}
	}
	if c.Stopped > 0 {
		fmt.Fprintf(&b, ", %d still streaming when the client stopped waiting (cut off, not completed)", c.Stopped)
	}
	if c.Cut > 0 {
		fmt.Fprintf(&b, ", %d answers ended early by the server", c.Cut)
	}
	if c.Abandoned > 0 {
		fmt.Fprintf(&b, ", %d given up by the client before any response", c.Abandoned)
	}
	if c.Errors > 0 {
		fmt.Fprintf(&b, ", %d with no response", c.Errors)
	}
	return b.String()
}

// Decode throughput through the Go SDK: N greedy requests of the same prompt at once, each read by
// its own goroutine. The twin of tools/bench_engine_decode.cpp (the C++ engine driven directly,
// same engine settings, same prompt, same definition); tools/bench_go.sh runs both interleaved.
//
//	benchdecode -model PATH -n 16 -max-tokens 128 -threads 2
//
// prints one JSON line: decode_tok_s = tokens after every request's first, over the time from the
// last first token to the last token; and the boundary: cgo call cost, polls, Go dispatch time.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"selfserve"
)

func main() {
	modelPath := flag.String("model", "", "model (default: the default model)")
	n := flag.Int("n", 1, "concurrent requests")
	maxTokens := flag.Int("max-tokens", 128, "tokens per request")
	threads := flag.Int("threads", 0, "CPU threads (0: all cores)")
	cuda := flag.Bool("cuda", false, "on the GPU (KV cache sized from its memory)")
	linger := flag.Duration("linger", 0, "EngineOptions.PollLinger")
	stepInPoll := flag.Bool("step-in-poll", false, "run the steps inside the Go poll (EngineOptions.StepInPoll)")
	flag.Parse()

	model, err := selfserve.Load(*modelPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	device := selfserve.DeviceCPU
	if *cuda {
		device = selfserve.DeviceCUDA
	}
	engine, err := selfserve.NewEngine(model, selfserve.EngineOptions{Device: device, Threads: *threads, StepInPoll: *stepInPoll, PollLinger: *linger})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer engine.Close()

	var mu sync.Mutex
	var tokens int64
	var firsts int
	var allFirst, last time.Time
	streams := make([]*selfserve.Stream, *n)
	for i := range streams {
		streams[i], err = engine.Generate(context.Background(), selfserve.Request{
			Prompt: "The history of the printing press", MaxTokens: *maxTokens, IgnoreEOS: true})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	cpu0, sw0 := callerCPU()
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Add(1)
		go func(s *selfserve.Stream) {
			defer wg.Done()
			got := 0
			for {
				ev, err := s.Recv()
				if err != nil {
					return
				}
				if ev.Token < 0 {
					continue
				}
				now := time.Now()
				mu.Lock()
				tokens++
				if got++; got == 1 {
					if firsts++; firsts == *n {
						allFirst = now
					}
				}
				if now.After(last) {
					last = now
				}
				mu.Unlock()
			}
		}(s)
	}
	wg.Wait()
	cpu1, sw1 := callerCPU()
	callerSecs := cpu1 - cpu0
	m, _ := engine.Metrics()
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	secs := last.Sub(allFirst).Seconds()
	out := map[string]any{
		"impl": map[bool]string{false: "go", true: "go-step-in-poll"}[*stepInPoll] + map[bool]string{false: "", true: "-linger"}[*linger > 0], "n": *n, "tokens": tokens, "decode_tok_s": float64(tokens-int64(*n)) / secs,
		"cgo_call_ns":         float64(selfserve.CallOverhead(200000).Nanoseconds()),
		"polls":               m.Polls,
		"caller_cpu_us_tok":   callerSecs * 1e6 / float64(tokens),
		"caller_switches_tok": float64(sw1-sw0) / float64(tokens),
		"ctx_switches":        ru.Nvcsw + ru.Nivcsw,
		"polls_with_events":   m.GoBatches,
		"events":              m.Events,
		"go_dispatch_us_poll": m.GoDispatchSeconds * 1e6 / float64(m.GoBatches),
		"decode_step_ms":      1e3 * m.DecodeStepSeconds / float64(m.DecodeSteps),
		"go_dispatch_ns_tok":  m.GoDispatchSeconds * 1e9 / float64(m.Events),
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

// callerCPU is the CPU time (s) of this process's threads other than the engine's (ss-engine, the
// stepping thread, and ss-cpu, its workers): what the Go side spends, scheduler and GC included;
// and their context switches (voluntary and not): how often the Go side's threads slept and woke.
func callerCPU() (secs float64, switches int64) {
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		dir := "/proc/self/task/" + t.Name()
		comm, _ := os.ReadFile(dir + "/comm")
		if name := strings.TrimSpace(string(comm)); name == "ss-engine" || name == "ss-cpu" {
			continue
		}
		// schedstat's first field: nanoseconds on a CPU.
		stat, err := os.ReadFile(dir + "/schedstat")
		if err != nil {
			continue
		}
		ns, _ := strconv.ParseFloat(strings.Fields(string(stat))[0], 64)
		secs += ns / 1e9
		status, _ := os.ReadFile(dir + "/status")
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 2 && strings.HasSuffix(f[0], "ctxt_switches:") {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				switches += n
			}
		}
	}
	return secs, switches
}

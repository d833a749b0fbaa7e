package selfserve

// On the default model (skipped without it: selfserve fetch). The C++ CLI is the reference for
// greedy output: $SELFSERVE_BIN, else ../build/selfserve.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	testModel  *Model
	testEngine *Engine
	modelPath  string
)

func TestMain(m *testing.M) {
	modelPath = os.Getenv("SELFSERVE_TEST_MODEL")
	if modelPath == "" {
		modelPath = DefaultModelPath()
	}
	if _, err := os.Stat(modelPath); err != nil {
		fmt.Fprintf(os.Stderr, "skipped: no model at %s (selfserve fetch)\n", modelPath)
		os.Exit(0)
	}
	var err error
	if testModel, err = Load(modelPath); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if testEngine, err = NewEngine(testModel, EngineOptions{Device: DeviceCPU, Threads: 2, KVCacheMiB: 64, MaxNumSeqs: 16}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testEngine.Close()
	testModel.Close()
	os.Exit(code)
}

func cliPath(t *testing.T) string {
	if p := os.Getenv("SELFSERVE_BIN"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../build/selfserve")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no selfserve CLI at %s (set SELFSERVE_BIN)", p)
	}
	return p
}

// The CLI's greedy text and its count of generated tokens.
func cliGreedy(t *testing.T, prompt string, n int, chat bool) (string, int) {
	args := []string{"generate", "-m", modelPath, "-p", prompt, "-n", strconv.Itoa(n), "-t", "0", "-q",
		"--device", "cpu", "--threads", "2"}
	if chat {
		args = append(args, "--chat")
	}
	cmd := exec.Command(cliPath(t), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("selfserve generate: %v\n%s", err, stderr.String())
	}
	m := regexp.MustCompile(`generated: (\d+) tokens`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no token count in the CLI's stderr: %q", stderr.String())
	}
	count, _ := strconv.Atoi(m[1])
	return strings.TrimSuffix(string(out), "\n"), count
}

func generate(t *testing.T, ctx context.Context, req Request) (Result, error) {
	t.Helper()
	s, err := testEngine.Generate(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return s.Collect()
}

func TestGreedyMatchesCLI(t *testing.T) {
	const prompt = "The three most useful things to know about the ocean are"
	want, wantTokens := cliGreedy(t, prompt, 40, false)
	got, err := generate(t, context.Background(), Request{Prompt: prompt, MaxTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	if got.Text != want || len(got.Tokens) != wantTokens || got.Usage.CompletionTokens != wantTokens {
		t.Fatalf("Go SDK: %d tokens %q\nCLI:    %d tokens %q", len(got.Tokens), got.Text, wantTokens, want)
	}
	if got.Finish != FinishLength && got.Finish != FinishStop {
		t.Fatalf("finish %v", got.Finish)
	}
}

func TestChatMatchesCLI(t *testing.T) {
	const question = "What is the capital of France?"
	want, wantTokens := cliGreedy(t, question, 48, true)
	s, err := testEngine.Chat(context.Background(), []Message{{Role: "user", Content: question}}, Request{MaxTokens: 48})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Collect()
	if err != nil {
		t.Fatal(err)
	}
	// Both count the end-of-turn token and leave it out of the text.
	if got.Text != want || len(got.Tokens) != wantTokens {
		t.Fatalf("Go SDK: %d tokens %q\nCLI:    %d tokens %q", len(got.Tokens), got.Text, wantTokens, want)
	}
}

// Greedy tokens do not depend on what else runs: concurrent goroutines get the solo answer, and
// events came in batches (fewer polls with events than tokens).
func TestConcurrentRequestsMatchSolo(t *testing.T) {
	prompts := []string{"Once upon a time", "The recipe for bread:", "def fibonacci(n):", "In 1905, Einstein"}
	solo := make([]Result, len(prompts))
	for i, p := range prompts {
		r, err := generate(t, context.Background(), Request{Prompt: p, MaxTokens: 24, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		solo[i] = r
	}
	before, _ := testEngine.Metrics()
	const copies = 3
	var wg sync.WaitGroup
	errs := make(chan error, copies*len(prompts))
	for c := 0; c < copies; c++ {
		for i, p := range prompts {
			wg.Add(1)
			go func(i int, p string) {
				defer wg.Done()
				r, err := generate(t, context.Background(), Request{Prompt: p, MaxTokens: 24, IgnoreEOS: true})
				if err == nil && (r.Text != solo[i].Text || fmt.Sprint(r.Tokens) != fmt.Sprint(solo[i].Tokens)) {
					err = fmt.Errorf("%q: batched %q, solo %q", p, r.Text, solo[i].Text)
				}
				errs <- err
			}(i, p)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	after, _ := testEngine.Metrics()
	tokens := after.GenerationTokens - before.GenerationTokens
	batches := after.GoBatches - before.GoBatches
	if tokens != copies*int64(len(prompts))*24 || batches >= tokens/2 {
		t.Fatalf("%d tokens arrived in %d polls with events: expected batches of several", tokens, batches)
	}
}

// Cancelling the context ends the request in the engine within a step and frees its KV blocks.
func TestCancelFreesKVBlocks(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := testEngine.Generate(ctx, Request{Prompt: "Write a very long story about a dragon.", MaxTokens: 2000, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	mid, _ := testEngine.Metrics()
	if mid.KVBlocksUsed == 0 || mid.Running != 1 {
		t.Fatalf("while running: %d KV blocks used, %d running", mid.KVBlocksUsed, mid.Running)
	}
	cancel()
	atCancel, _ := testEngine.Metrics()
	var last Event
	for {
		ev, err := s.Recv()
		if err == nil {
			last = ev
			continue
		}
		if !errors.Is(err, ErrCancelled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v: want ErrCancelled wrapping context.Canceled", err)
		}
		var se *Error
		if !errors.As(err, &se) || se.Code != CodeCancelled {
			t.Fatalf("error %#v is not a *selfserve.Error", err)
		}
		break
	}
	if last.Finish != FinishCancelled {
		t.Fatalf("last event finish %v, want cancelled", last.Finish)
	}
	after, _ := testEngine.Metrics()
	// The step in flight when cancel() ran may finish; the next one ends the request.
	if after.Steps-atCancel.Steps > 2 {
		t.Fatalf("cancelled after %d more steps", after.Steps-atCancel.Steps)
	}
	if after.KVBlocksUsed != 0 || after.Running != 0 {
		t.Fatalf("after cancel: %d KV blocks used, %d running", after.KVBlocksUsed, after.Running)
	}
	if last.Usage.CompletionTokens >= 2000 {
		t.Fatal("ran to the end")
	}
}

// A context deadline ends the request with its own error, and the engine goes on serving.
func TestDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	r, err := generate(t, ctx, Request{Prompt: "Count from one to a million:", MaxTokens: 2000, IgnoreEOS: true})
	if !errors.Is(err, ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v: want ErrDeadlineExceeded wrapping context.DeadlineExceeded", err)
	}
	if r.Finish != FinishTimeout && r.Finish != FinishCancelled {
		t.Fatalf("finish %v", r.Finish)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 30*time.Second {
		t.Fatalf("ended after %v", el)
	}
	expired, cancel2 := context.WithTimeout(context.Background(), -time.Second)
	defer cancel2()
	if _, err := testEngine.Generate(expired, Request{Prompt: "x"}); !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("expired context: %v", err)
	}
	if _, err := generate(t, context.Background(), Request{Prompt: "Still there?", MaxTokens: 4}); err != nil {
		t.Fatalf("after a deadline: %v", err)
	}
}

func TestBadInputsAreTypedAndTheEngineKeepsServing(t *testing.T) {
	_, err := Load("/nonexistent/model.gguf")
	var se *Error
	if !errors.Is(err, ErrNotFound) || !errors.As(err, &se) || se.File == "" || se.Line == 0 ||
		!strings.Contains(se.Message, "/nonexistent/model.gguf") {
		t.Fatalf("missing file: %#v", err)
	}

	// A truncated model: its first megabyte.
	data, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	trunc := filepath.Join(t.TempDir(), "truncated.gguf")
	if err := os.WriteFile(trunc, data[:1<<20], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(trunc); !errors.Is(err, ErrInvalidModel) || !strings.Contains(err.Error(), "truncated.gguf") {
		t.Fatalf("truncated model: %v", err)
	}
	if err := Validate(trunc); !errors.Is(err, ErrInvalidModel) {
		t.Fatalf("validate truncated model: %v", err)
	}

	// A GPU where there is none (or a build without CUDA) is its own error; where there is one,
	// the engine runs on it.
	if e, err := NewEngine(testModel, EngineOptions{Device: DeviceCUDA, KVCacheMiB: 16}); err != nil {
		if !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrDevice) && !errors.Is(err, ErrOutOfMemory) {
			t.Errorf("CUDA engine: %v", err)
		}
	} else {
		if !strings.HasPrefix(e.Device(), "cuda") {
			t.Errorf("CUDA engine on %q", e.Device())
		}
		e.Close()
	}
	if _, err := NewEngine(testModel, EngineOptions{MaxNumSeqs: -3}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative MaxNumSeqs: %v", err)
	}

	bad := []struct {
		req  Request
		what string
	}{
		{Request{Prompt: "x", JSONSchema: `{"type": "object",`}, "json_schema"},
		{Request{Prompt: "x", ExtraJSON: `[1, 2`}, "extra_json"},
		{Request{Prompt: "x", Temperature: -1}, "temperature"},
		{Request{Prompt: "x", TopP: 1.5}, "top_p"},
		{Request{Prompt: "x", RepetitionPenalty: -2}, "repetition_penalty"},
		{Request{Prompt: "x", MaxTokens: 1 << 30}, "context"},
		{Request{Prompt: "x", Logprobs: true, TopLogprobs: 1000}, "logprobs"},
		{Request{Prompt: "x", Regex: "(unclosed"}, ""},
		{Request{Prompt: "x", Messages: []Message{{Role: "user", Content: "y"}}}, "Prompt or Messages"},
	}
	for _, b := range bad {
		_, err := testEngine.Generate(context.Background(), b.req)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), b.what) {
			t.Errorf("%+v: error %v, want ErrInvalidArgument naming %q", b.req, err, b.what)
		}
	}
	r, err := generate(t, context.Background(), Request{Prompt: "The sky is", MaxTokens: 8, IgnoreEOS: true})
	if err != nil || len(r.Tokens) != 8 {
		t.Fatalf("after bad inputs: %v, %d tokens", err, len(r.Tokens))
	}
}

func TestStopStringsAndStructuredOutput(t *testing.T) {
	free, err := generate(t, context.Background(), Request{Prompt: "1, 2, 3, 4,", MaxTokens: 16, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(free.Text) < 6 {
		t.Skipf("too little text to cut: %q", free.Text)
	}
	stop := free.Text[3:6]
	r, err := generate(t, context.Background(), Request{Prompt: "1, 2, 3, 4,", MaxTokens: 16, IgnoreEOS: true, Stop: []string{stop}})
	if err != nil {
		t.Fatal(err)
	}
	if want := free.Text[:strings.Index(free.Text, stop)]; r.Text != want || r.Finish != FinishStop || r.StopReason != stop {
		t.Fatalf("stop %q: got %q (%v, %q), want %q", stop, r.Text, r.Finish, r.StopReason, want)
	}
	j, err := generate(t, context.Background(), Request{Prompt: "A number:", MaxTokens: 8, Regex: "[0-9]{3}"})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9]{3}$`).MatchString(j.Text) {
		t.Fatalf("regex output %q", j.Text)
	}
}

func TestCloseEndsLiveStreams(t *testing.T) {
	e, err := NewEngine(testModel, EngineOptions{Device: DeviceCPU, Threads: 1, KVCacheMiB: 16})
	if err != nil {
		t.Fatal(err)
	}
	if e.Device() != "cpu" {
		t.Fatalf("device %q", e.Device())
	}
	s, err := e.Generate(context.Background(), Request{Prompt: "Go on and on", MaxTokens: 600, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	e.Close()
	for {
		if _, err = s.Recv(); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if _, err := e.Generate(context.Background(), Request{Prompt: "x"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Generate after Close: %v", err)
	}
	if err == io.EOF {
		t.Fatal("unreachable")
	}
	e.Close() // twice is fine
}

// The readers poll for themselves (a baton passed among goroutines in Recv): a reader that stops
// reading must not hold up the others, and its stream loses nothing meanwhile (its events wait in
// the engine's queue or its own), in order: greedy output equal to the solo run's.
func TestReaderThatStopsDoesNotHoldUpOthers(t *testing.T) {
	reqA := Request{Prompt: "A list of rivers:", MaxTokens: 48, IgnoreEOS: true}
	reqB := Request{Prompt: "How to boil an egg:", MaxTokens: 24, IgnoreEOS: true}
	soloA, err := generate(t, context.Background(), reqA)
	if err != nil {
		t.Fatal(err)
	}
	soloB, err := generate(t, context.Background(), reqB)
	if err != nil {
		t.Fatal(err)
	}
	a, err := testEngine.Generate(context.Background(), reqA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := testEngine.Generate(context.Background(), reqB)
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.Recv() // A's reader may hold the baton here, and leaves with it
	if err != nil {
		t.Fatal(err)
	}
	gotB := make(chan Result, 1)
	go func() {
		r, err := b.Collect()
		if err != nil {
			t.Error(err)
		}
		gotB <- r
	}()
	select {
	case r := <-gotB:
		if r.Text != soloB.Text || fmt.Sprint(r.Tokens) != fmt.Sprint(soloB.Tokens) {
			t.Fatalf("B beside an unread A: %q, solo %q", r.Text, soloB.Text)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("B did not finish while A's reader was away")
	}
	restA, err := a.Collect()
	if err != nil {
		t.Fatal(err)
	}
	tokens := append([]int{first.Token}, restA.Tokens...)
	if first.Text+restA.Text != soloA.Text || fmt.Sprint(tokens) != fmt.Sprint(soloA.Tokens) {
		t.Fatalf("A read late: %q, solo %q", first.Text+restA.Text, soloA.Text)
	}
}

// The baton passes to a reader still waiting: with one sequence at a time, B waits in the engine
// (no events) while A's reader polls; A's reader leaves for good after A's last event, and B's
// events come after that, so only a reader B's goroutine took the baton from can deliver them.
func TestBatonPassesToAWaitingReader(t *testing.T) {
	e, err := NewEngine(testModel, EngineOptions{Device: DeviceCPU, Threads: 1, KVCacheMiB: 16, MaxNumSeqs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	a, err := e.Generate(context.Background(), Request{Prompt: "One, two,", MaxTokens: 24, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Generate(context.Background(), Request{Prompt: "Red, green,", MaxTokens: 8, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	// A's reader takes the baton first: B's starts once A's is in its stride (blocked in Recv,
	// polling, nearly all the time).
	doneA := make(chan error, 1)
	aStarted := make(chan struct{})
	go func() {
		for i := 0; i < 3; i++ {
			if _, err := a.Recv(); err != nil {
				doneA <- err
				return
			}
		}
		close(aStarted)
		_, err := a.Collect()
		doneA <- err
	}()
	select {
	case <-aStarted:
	case err := <-doneA:
		t.Fatal(err)
	}
	doneB := make(chan error, 1)
	go func() {
		r, err := b.Collect()
		if err == nil && len(r.Tokens) != 8 {
			err = fmt.Errorf("B got %d tokens, want 8", len(r.Tokens))
		}
		doneB <- err
	}()
	for _, ch := range []chan error{doneA, doneB} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a reader waiting in Recv got nothing after the polling reader left")
		}
	}
}

// Close while readers are blocked in Recv (one of them waiting on the engine's event fd, the
// others for it): every reader ends with ErrClosed.
func TestCloseWhileReadersWait(t *testing.T) {
	e, err := NewEngine(testModel, EngineOptions{Device: DeviceCPU, Threads: 1, KVCacheMiB: 64})
	if err != nil {
		t.Fatal(err)
	}
	const readers = 3
	errs := make(chan error, readers)
	started := make(chan struct{}, readers)
	for i := 0; i < readers; i++ {
		s, err := e.Generate(context.Background(), Request{Prompt: fmt.Sprint("Count to ", 1000+i), MaxTokens: 400, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			n := 0
			for {
				_, err := s.Recv()
				if err != nil {
					errs <- err
					return
				}
				if n++; n == 2 {
					started <- struct{}{}
				}
			}
		}()
	}
	for i := 0; i < readers; i++ {
		select {
		case <-started:
		case <-time.After(60 * time.Second):
			t.Fatal("the readers got no events")
		}
	}
	e.Close()
	for i := 0; i < readers; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("reader ended with %v, want ErrClosed", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a reader blocked in Recv did not return after Close")
		}
	}
}

// Driven from the poll goroutine (StepInPoll) and with lingering polls: the same greedy tokens,
// and each poll with events carries several steps' tokens.
func TestStepInPollWithLinger(t *testing.T) {
	const prompt = "Three facts about owls:"
	want, err := generate(t, context.Background(), Request{Prompt: prompt, MaxTokens: 24, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, stepInPoll := range []bool{true, false} {
		e, err := NewEngine(testModel, EngineOptions{Device: DeviceCPU, Threads: 2, KVCacheMiB: 16, StepInPoll: stepInPoll,
			PollLinger: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 24, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Collect()
		if err != nil {
			t.Fatal(err)
		}
		m, _ := e.Metrics()
		e.Close()
		if got.Text != want.Text || fmt.Sprint(got.Tokens) != fmt.Sprint(want.Tokens) {
			t.Fatalf("StepInPoll %v: %q, want %q", stepInPoll, got.Text, want.Text)
		}
		if m.GoBatches*2 > int64(len(got.Tokens)) {
			t.Fatalf("StepInPoll %v: %d tokens came in %d polls; lingering should batch several steps", stepInPoll,
				len(got.Tokens), m.GoBatches)
		}
	}
}

// An Engine nobody closes is freed by its finalizer once unreachable (its poll goroutine ends and
// the C engine is freed), and so is a Model.
func TestFinalizersFreeWhatNobodyClosed(t *testing.T) {
	var inner *engine
	var innerModel *model
	func() {
		m, err := Load(modelPath)
		if err != nil {
			t.Fatal(err)
		}
		e, err := NewEngine(m, EngineOptions{Device: DeviceCPU, Threads: 1, KVCacheMiB: 16})
		if err != nil {
			t.Fatal(err)
		}
		inner, innerModel = e.e, m.m
		if _, err := e.Generate(context.Background(), Request{Prompt: "x", MaxTokens: 2}); err != nil {
			t.Fatal(err)
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		runtime.GC()
		select {
		case <-inner.done:
			innerModel.mu.Lock()
			freed := innerModel.c == nil
			innerModel.mu.Unlock()
			if !freed && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if !freed {
				t.Fatal("the model's finalizer did not run")
			}
			if inner.c != nil {
				t.Fatal("the engine's poll goroutine ended without freeing it")
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine's finalizer did not run")
		}
	}
}

// Package selfserve embeds the selfserve inference engine (a C++ data plane) in Go programs
// through its C ABI (libselfserve.so, include/selfserve.h).
//
// Each ss_engine_poll returns a batch of events (a token of every running request, from whole
// engine steps), fanned out to their Streams: one cgo call per poll, never one per token. By
// default the engine steps on a C++ thread of its own, so Go's scheduling never delays a step, and
// the readers poll for themselves: one goroutine blocked in Stream.Recv waits on the engine's
// event fd, polls, and hands the other streams their events (a lone reader is woken once per
// token, not twice). With EngineOptions.StepInPoll the steps run inside the polls of one poll
// goroutine per engine instead. The goroutine that creates the engine (and with StepInPoll drives
// it) and frees it is locked to its OS thread when a GPU may be used. A request's context cancels
// it in the engine (its KV blocks are freed in the next step); a context deadline is also given
// to the engine as the request's timeout. Errors are *Error values carrying the engine's code,
// message and the C++ file:line they arose at; match them with errors.Is against the Err*
// sentinels.
//
// Build against an installed library: cmake --install build --prefix DIR, then
// PKG_CONFIG_PATH=DIR/lib/pkgconfig go build.
package selfserve

/*
#cgo pkg-config: selfserve
#include <selfserve.h>
#include <stdlib.h>
#include <string.h>

// ss_last_error is per OS thread and a goroutine may change threads between two cgo calls, so
// every call that can fail copies its error out within the same cgo call.
typedef struct go_err { int32_t code; char* message; char* file; int32_t line; } go_err;

static ss_status go_fill(ss_status st, go_err* g) {
  if (st != SS_OK) {
    const ss_error* e = ss_last_error();
    g->code = e->code;
    g->message = strdup(e->message);
    g->file = strdup(e->file);
    g->line = e->line;
  }
  return st;
}
static ss_status go_model_load(const char* path, ss_model** out, go_err* g) {
  ss_model_options o;
  ss_model_options_init(&o);
  o.path = path;
  return go_fill(ss_model_load(&o, out), g);
}
static ss_status go_model_validate(const char* path, go_err* g) {
  ss_model_options o;
  ss_model_options_init(&o);
  o.path = path;
  return go_fill(ss_model_validate(&o), g);
}
static ss_status go_engine_create(ss_model* m, const ss_engine_options* o, ss_engine** out, go_err* g) {
  return go_fill(ss_engine_create(m, o, out), g);
}
static ss_status go_submit(ss_engine* e, const ss_request_options* o, uint64_t* id, go_err* g) {
  return go_fill(ss_engine_submit(e, o, id), g);
}
static ss_status go_poll(ss_engine* e, ss_event* ev, size_t cap, size_t* n, int32_t timeout_ms, go_err* g) {
  return go_fill(ss_engine_poll(e, ev, sizeof(ss_event), cap, n, timeout_ms), g);
}
static ss_status go_metrics(ss_engine* e, ss_metrics* m, go_err* g) {
  m->struct_size = sizeof(ss_metrics);
  return go_fill(ss_engine_metrics(e, m), g);
}
*/
import "C"

import (
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

func takeError(g *C.go_err) error {
	e := &Error{Code: Code(g.code), Message: C.GoString(g.message), File: C.GoString(g.file), Line: int(g.line)}
	C.free(unsafe.Pointer(g.message))
	C.free(unsafe.Pointer(g.file))
	return e
}

// Version is the library's version ("0.1.0").
func Version() string { return C.GoString(C.ss_version()) }

// DefaultModelPath is where the default model (SmolLM2-135M-Instruct) is cached.
func DefaultModelPath() string { return C.GoString(C.ss_default_model_path()) }

// ---- models ------------------------------------------------------------------------------------

// Model is a loaded, validated model. Engines keep their own reference: Close it whenever.
type Model struct{ m *model }

type model struct {
	mu sync.Mutex
	c  *C.ss_model
}

// ModelInfo describes a model.
type ModelInfo struct {
	Path         string
	Architecture string
	VocabSize    int
	MaxContext   int
	Layers       int
}

// Load loads and validates a GGUF file or a Hugging Face folder; "" loads the default model
// (fetched into $SELFSERVE_HOME when missing).
func Load(path string) (*Model, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var g C.go_err
	var c *C.ss_model
	if C.go_model_load(cpath, &c, &g) != C.SS_OK {
		return nil, takeError(&g)
	}
	m := &Model{&model{c: c}}
	runtime.SetFinalizer(m, func(m *Model) { m.m.close() })
	return m, nil
}

// Validate loads a model, scans every weight for NaN/Inf and frees it: the verdict only.
func Validate(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var g C.go_err
	if C.go_model_validate(cpath, &g) != C.SS_OK {
		return takeError(&g)
	}
	return nil
}

// Info describes the model.
func (m *Model) Info() ModelInfo {
	m.m.mu.Lock()
	defer m.m.mu.Unlock()
	if m.m.c == nil {
		return ModelInfo{}
	}
	var i C.ss_model_info
	i.struct_size = C.size_t(unsafe.Sizeof(i))
	C.ss_model_info_get(m.m.c, &i)
	return ModelInfo{Path: C.GoString(i.path), Architecture: C.GoString(i.architecture),
		VocabSize: int(i.vocab_size), MaxContext: int(i.max_context), Layers: int(i.n_layers)}
}

// Close frees the model (engines made from it keep working).
func (m *Model) Close() {
	m.m.close()
	runtime.SetFinalizer(m, nil)
}

func (m *model) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	C.ss_model_free(m.c)
	m.c = nil
}

// ---- engines -----------------------------------------------------------------------------------

// Device picks the backend.
type Device int

const (
	DeviceAuto Device = iota // CUDA when a usable GPU is present, else the CPU
	DeviceCPU
	DeviceCUDA
)

// EngineOptions are the serving knobs; zero values take the library's defaults.
type EngineOptions struct {
	Device               Device
	Threads              int     // CPU threads for the forward pass (0: all cores)
	MaxNumSeqs           int     // sequences per step (32)
	MaxNumBatchedTokens  int     // tokens per step (512)
	BlockSize            int     // tokens per KV block (16)
	NumKVBlocks          int     // 0: from KVCacheMiB (CPU) or GPUMemoryUtilization (CUDA)
	KVCacheMiB           float64 // KV cache budget (0: 512 on the CPU; on a GPU, GPUMemoryUtilization)
	MaxModelLen          int     // prompt + max tokens limit (0: the model's context and the cache)
	DisablePrefixCaching bool
	GPUMemoryUtilization float64 // CUDA: share of the GPU's memory to take (0.9)
	EnforceEager         bool    // CUDA: no CUDA graphs (every step launched kernel by kernel)
	// CUDA: a request's output the same bits at any load, prompt chunking or preemption (steps past
	// 8 rows run 8 rows at a time: large batches and long prompts slower). The CPU always is.
	BatchInvariant bool
	// How long one poll waits for work when the engine is idle (default 100 ms). Submits and Close
	// wake it at once; this only bounds a wait nobody interrupts.
	IdlePoll time.Duration
	// Events fetched per poll at most (default 256).
	PollBatch int
	// StepInPoll runs the forward passes inside each poll, on the poll goroutine's OS thread
	// (locked to it when a GPU may be used, the thread that created the engine). By default the
	// engine steps on a C++ thread of its own and a poll only collects events, so that Go's
	// scheduling never delays a step.
	StepInPoll bool
	// PollLinger: once a poll has events, it goes on collecting further steps' events for this
	// long before it returns (at most 10 s). Fewer, larger batches cost the Go side less per token,
	// at that much added latency per token. 0: every step's events are handed out at once.
	PollLinger time.Duration
}

// Engine serves requests on one model. All its methods are safe for concurrent use.
type Engine struct{ e *engine }

type engine struct {
	c      *C.ss_engine
	device string
	batch  int
	idle   time.Duration
	linger time.Duration // own thread: waited out in Go after a wake-up (a cgo call must not block)

	mu      sync.RWMutex // closed, and c against Close while a call uses it
	closed  bool
	closing chan struct{} // closed by Close
	streams sync.Map      // key (user_data) → *Stream
	nextKey uint64
	done    chan struct{} // the engine's goroutine has freed the engine

	// The poller's: ss_engine_poll runs on one thread at a time, that of the baton's holder
	// (readersPoll) or of the poll goroutine.
	buf    *C.ss_event
	evs    []C.ss_event
	pollG  C.go_err
	fd     *os.File // the engine's event fd (a dup), readable while events wait; nil: none
	pollTO C.int32_t

	// readersPoll (own thread and an event fd): no poll goroutine; the baton (leading) passes
	// among the goroutines blocked in Recv, its holder waits on fd and polls, the followers wait
	// for their events or the baton. Close takes the baton for good (closerWait).
	readersPoll bool
	lmu         sync.Mutex
	leading     bool
	followers   []*Stream
	closerWait  chan struct{}

	polls, events, batches atomic.Int64
	dispatchNanos          atomic.Int64 // Go time turning C events into stream events
}

// NewEngine starts an engine on m, and its poll goroutine.
func NewEngine(m *Model, opts EngineOptions) (*Engine, error) {
	var o C.ss_engine_options
	C.ss_engine_options_init(&o)
	o.device = C.int32_t(opts.Device)
	setInt := func(dst *C.int32_t, v int) {
		if v != 0 {
			*dst = C.int32_t(v)
		}
	}
	setInt(&o.threads, opts.Threads)
	setInt(&o.max_num_seqs, opts.MaxNumSeqs)
	setInt(&o.max_num_batched_tokens, opts.MaxNumBatchedTokens)
	setInt(&o.block_size, opts.BlockSize)
	setInt(&o.num_kv_blocks, opts.NumKVBlocks)
	setInt(&o.max_model_len, opts.MaxModelLen)
	if opts.KVCacheMiB != 0 {
		o.kv_cache_mib = C.double(opts.KVCacheMiB)
	}
	if opts.GPUMemoryUtilization != 0 {
		o.gpu_memory_utilization = C.double(opts.GPUMemoryUtilization)
	}
	if opts.DisablePrefixCaching {
		o.enable_prefix_caching = 0
	}
	if opts.EnforceEager {
		o.enforce_eager = 1
	}
	if opts.BatchInvariant {
		o.batch_invariant = 1
	}
	if !opts.StepInPoll {
		o.own_thread = 1
	}
	if opts.StepInPoll {
		o.poll_linger_us = C.int32_t(opts.PollLinger / time.Microsecond)
	}
	e := &engine{batch: opts.PollBatch, idle: opts.IdlePoll, linger: opts.PollLinger, done: make(chan struct{}),
		closing: make(chan struct{})}
	if e.batch <= 0 {
		e.batch = 256
	}
	if e.idle <= 0 {
		e.idle = 100 * time.Millisecond
	}
	m.m.mu.Lock()
	cm := m.m.c
	m.m.mu.Unlock()
	if cm == nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: "the model is closed"}
	}
	ready := make(chan error, 1)
	go e.run(cm, &o, opts.Device != DeviceCPU, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	runtime.KeepAlive(m) // the engine holds its own reference from here on
	pub := &Engine{e}
	runtime.SetFinalizer(pub, func(p *Engine) { p.e.close() })
	return pub, nil
}

// Device says which backend runs: "cpu" or "cuda (NVIDIA H200, ...)".
func (e *Engine) Device() string { return e.e.device }

// run is the engine's goroutine: it creates the engine, polls until Close (StepInPoll, or no
// event fd; otherwise the readers poll) and frees it, all on one OS thread when a GPU may be used
// (the CUDA backend is made, and with StepInPoll driven, and freed on the thread its context was
// first current on).
func (e *engine) run(m *C.ss_model, o *C.ss_engine_options, maybeCUDA bool, ready chan<- error) {
	if maybeCUDA {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	var g C.go_err
	var c *C.ss_engine
	if C.go_engine_create(m, o, &c, &g) != C.SS_OK {
		close(e.done)
		ready <- takeError(&g)
		return
	}
	e.c = c
	e.device = C.GoString(C.ss_engine_device(c))
	if maybeCUDA && strings.HasPrefix(e.device, "cpu") {
		runtime.UnlockOSThread() // nothing to pin; the deferred unlock is then a no-op
	}
	e.buf = (*C.ss_event)(C.malloc(C.size_t(e.batch) * C.size_t(unsafe.Sizeof(C.ss_event{}))))
	defer C.free(unsafe.Pointer(e.buf))
	e.evs = unsafe.Slice(e.buf, e.batch)
	// With the engine on its own thread, events are waited for in Go's netpoller on the engine's
	// event fd, not inside a cgo call: a goroutine blocked in C looks to the Go scheduler like a
	// long system call, and the consumers it has just woken would wait in its P's run queue until
	// sysmon hands them to another thread (measured: twice the context switches, and the engine's
	// steps slower for it). Each wake-up then collects with polls that do not block.
	if o.own_thread != 0 {
		if fd := int(C.ss_engine_event_fd(c)); fd >= 0 {
			if dup, err := syscall.Dup(fd); err == nil {
				e.fd = os.NewFile(uintptr(dup), "selfserve-events")
			}
		}
	}
	e.pollTO = C.int32_t(e.idle / time.Millisecond)
	// Readers poll for themselves: a goroutine of its own between the engine and the readers cost
	// a second goroutine (and often OS thread) wake-up per step, most of the Go side's CPU per
	// token when one request runs.
	e.readersPoll = e.fd != nil
	ready <- nil

	if e.readersPoll {
		<-e.closing
		e.lmu.Lock()
		if e.leading { // the holder sees closed (Close made the fd readable) and hands the baton here
			ch := make(chan struct{})
			e.closerWait = ch
			e.lmu.Unlock()
			<-ch
		} else {
			e.leading = true
			e.lmu.Unlock()
		}
	} else {
		for !e.isClosed() { // each poll waits up to IdlePoll (StepInPoll: stepping meanwhile)
			e.collect()
		}
	}
	if e.fd != nil {
		e.fd.Close()
	}
	e.mu.Lock()
	C.ss_engine_free(c)
	e.c = nil
	e.mu.Unlock()
	e.streams.Range(func(k, v any) bool {
		v.(*Stream).finish(&Error{Code: CodeClosed, Message: "the engine was closed"})
		e.streams.Delete(k)
		return true
	})
	close(e.done)
}

func (e *engine) isClosed() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.closed
}

// waitEvents blocks until the event fd says events wait (or a wake-up), then lets PollLinger
// pass. False: the fd failed (it cannot with an eventfd); polls then wait inside the C call.
func (e *engine) waitEvents() bool {
	var counter [8]byte
	if _, err := e.fd.Read(counter[:]); err != nil {
		e.fd.Close()
		e.fd = nil
		return false
	}
	if e.linger > 0 {
		time.Sleep(e.linger) // let a few more steps' events gather
	}
	e.pollTO = 0
	return true
}

// collect polls (blocking up to IdlePoll without an event fd, else not at all) and hands the
// events out; with an event fd it polls until the engine's queue is empty, as the fd's protocol
// asks (it signals only when the queue turns non-empty).
func (e *engine) collect() {
	for {
		var n C.size_t
		if C.go_poll(e.c, e.buf, C.size_t(e.batch), &n, e.pollTO, &e.pollG) != C.SS_OK {
			// A step failed with no request in it (those in a failed step get error events):
			// nobody to tell; Metrics' steps show it. Back off instead of spinning on it.
			_ = takeError(&e.pollG)
			time.Sleep(10 * time.Millisecond)
			return
		}
		e.polls.Add(1)
		if n == 0 {
			return
		}
		e.events.Add(int64(n))
		e.batches.Add(1)
		t0 := time.Now()
		for i := 0; i < int(n); i++ {
			e.dispatch(&e.evs[i])
		}
		e.dispatchNanos.Add(int64(time.Since(t0)))
		if int(n) < e.batch || e.fd == nil {
			return
		}
	}
}

// await blocks the reader of s (in Recv, its queue empty) until s may have news. Readers poll
// for themselves: whoever holds the baton waits on the event fd and hands out what comes until
// its own stream has news, then passes the baton to a reader still waiting (or drops it when none
// waits: then nobody is waiting for anything, and the engine's queue keeps the events for the
// next reader). The others wait for their events, or the baton. Lock order: e.lmu, then s.mu.
func (e *engine) await(s *Stream) {
	e.lmu.Lock()
	if !e.leading {
		e.leading = true
		e.lmu.Unlock()
		e.lead(s)
		return
	}
	e.followers = append(e.followers, s)
	e.lmu.Unlock()
	<-s.wake
	e.lmu.Lock()
	if s.promoted {
		s.promoted = false
		e.lmu.Unlock()
		e.lead(s)
		return
	}
	for i, f := range e.followers {
		if f == s {
			e.dropFollower(i)
			break
		}
	}
	e.lmu.Unlock()
}

// lead polls for s's reader, which holds the baton, until s has news or the engine closes, then
// passes the baton on.
func (e *engine) lead(s *Stream) {
	for !s.hasNews() && !e.isClosed() {
		if e.fd != nil {
			e.waitEvents() // on failure the poll waits instead, up to IdlePoll
		}
		e.collect()
	}
	select { // a wake-up it pushed to itself: stale, Recv looks at the queue anyway
	case <-s.wake:
	default:
	}
	e.lmu.Lock()
	if e.closerWait != nil { // Close takes it for good
		close(e.closerWait)
		e.closerWait = nil
		e.lmu.Unlock()
		return
	}
	// To a reader still waiting for news: one that was just handed an event wakes anyway, but
	// may leave Recv before it could poll for the others.
	for i := len(e.followers) - 1; i >= 0; i-- {
		if f := e.followers[i]; !f.hasNews() {
			e.dropFollower(i)
			f.promoted = true
			e.lmu.Unlock()
			f.notify()
			return
		}
	}
	e.leading = false
	e.lmu.Unlock()
}

// dropFollower takes followers[i] off the list (e.lmu held).
func (e *engine) dropFollower(i int) {
	last := len(e.followers) - 1
	e.followers[i] = e.followers[last]
	e.followers[last] = nil
	e.followers = e.followers[:last]
}

// dispatch copies one C event into Go memory and hands it to its stream (the poller only).
func (e *engine) dispatch(c *C.ss_event) {
	v, ok := e.streams.Load(uint64(c.user_data))
	if !ok {
		return // a request whose stream was abandoned
	}
	s := v.(*Stream)
	ev := Event{
		Token:  int(c.token),
		Text:   C.GoStringN(c.text, C.int(c.text_len)),
		Finish: FinishReason(c.finish),
		Usage:  Usage{PromptTokens: int(c.prompt_tokens), CompletionTokens: int(c.completion_tokens)},
	}
	if c.has_logprob != 0 {
		ev.HasLogprob = true
		ev.Logprob = float32(c.logprob)
		if c.num_top_logprobs > 0 {
			top := unsafe.Slice(c.top_logprobs, int(c.num_top_logprobs))
			ev.TopLogprobs = make([]TokenLogprob, len(top))
			for i, t := range top {
				ev.TopLogprobs[i] = TokenLogprob{Token: int(t.token), Logprob: float32(t.logprob)}
			}
		}
	}
	if c.stop_reason != nil {
		ev.StopReason = C.GoString(c.stop_reason)
	}
	var err error
	if ev.Finish != FinishNone {
		e.streams.Delete(uint64(c.user_data))
		err = s.finishError(ev.Finish, Code(c.error_code), C.GoString(c.error_message))
	}
	s.push(ev, err)
}

// Close stops the poll goroutine and frees the engine; live requests end with ErrClosed.
func (e *Engine) Close() {
	e.e.close()
	runtime.SetFinalizer(e, nil)
}

func (e *engine) close() {
	e.mu.Lock()
	already := e.closed
	e.closed = true
	if !already && e.c != nil {
		// Wakes whoever waits for events (the fd's or the poll's), to see closed. Under mu: the
		// engine's goroutine frees c under it once it has seen closed.
		C.ss_engine_wake(e.c)
	}
	e.mu.Unlock()
	if !already {
		close(e.closing)
	}
	<-e.done
}

// Metrics is a snapshot of the engine, taken after its last step.
type Metrics struct {
	Running, Waiting               int
	KVBlocksTotal, KVBlocksUsed    int
	KVBlocksCached                 int
	KVUsage                        float64
	PromptTokens, GenerationTokens int64
	FinishedRequests, Preemptions  int64
	Steps, DecodeSteps             int64
	DecodeStepSeconds              float64
	DecodeStepTokens               int64
	PrefixHitRate                  float64
	// The boundary: ss_engine_poll calls and the events they carried (the C side's count); on
	// the Go side the polls that returned events and the time spent handing their events out.
	Polls, Events, GoBatches int64
	GoDispatchSeconds        float64
}

// Metrics reads the engine's counters.
func (e *Engine) Metrics() (Metrics, error) {
	e.e.mu.RLock()
	defer e.e.mu.RUnlock()
	if e.e.c == nil || e.e.closed {
		return Metrics{}, &Error{Code: CodeClosed, Message: "the engine is closed"}
	}
	var m C.ss_metrics
	var g C.go_err
	if C.go_metrics(e.e.c, &m, &g) != C.SS_OK {
		return Metrics{}, takeError(&g)
	}
	return Metrics{
		Running: int(m.num_running), Waiting: int(m.num_waiting),
		KVBlocksTotal: int(m.kv_blocks_total), KVBlocksUsed: int(m.kv_blocks_used), KVBlocksCached: int(m.kv_blocks_cached),
		KVUsage: float64(m.kv_usage), PromptTokens: int64(m.prompt_tokens), GenerationTokens: int64(m.generation_tokens),
		FinishedRequests: int64(m.finished_requests), Preemptions: int64(m.preemptions), Steps: int64(m.steps),
		DecodeSteps: int64(m.decode_steps), DecodeStepSeconds: float64(m.decode_step_seconds),
		DecodeStepTokens: int64(m.decode_step_tokens), PrefixHitRate: float64(m.prefix_hit_rate),
		Polls: int64(m.polls), Events: int64(m.events), GoBatches: e.e.batches.Load(),
		GoDispatchSeconds: float64(e.e.dispatchNanos.Load()) / 1e9,
	}, nil
}

// CallOverhead measures one cgo call into the library (a trivial ss_* function, n times): the
// fixed cost every poll pays to cross the boundary.
func CallOverhead(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		C.ss_status_name(0)
	}
	return time.Since(t0) / time.Duration(n)
}

// ---- requests ----------------------------------------------------------------------------------

// Message is one turn of a chat.
type Message struct {
	Role    string // "system", "user", "assistant", "tool"
	Content string
}

// Request is a completion (Prompt) or a chat (Messages). Zero values take defaults: greedy
// sampling (Temperature 0), 256 tokens at most, seed 0.
type Request struct {
	Prompt   string
	Messages []Message

	MaxTokens         int
	MinTokens         int
	Temperature       float32
	TopP              float32 // 0: off (1)
	TopK              int
	MinP              float32
	RepetitionPenalty float32 // 0: off (1)
	PresencePenalty   float32
	FrequencyPenalty  float32
	Seed              int64 // < 0: random
	Stop              []string
	IgnoreEOS         bool
	Logprobs          bool // each token's logprob ...
	TopLogprobs       int  // ... and the top k (at most 20)
	// Structured output, at most one: a JSON Schema (JSON text), a regex, a GBNF grammar.
	JSONSchema, Regex, Grammar string
	// Further OpenAI / vLLM request fields as a JSON object (logit_bias, response_format, ...).
	ExtraJSON string
}

// FinishReason says why a request ended.
type FinishReason int

const (
	FinishNone      FinishReason = iota // still running
	FinishLength                        // MaxTokens or the context reached
	FinishStop                          // an end-of-generation token, a stop string, the grammar completed
	FinishCancelled                     // its context was cancelled
	FinishTimeout                       // its deadline passed
	FinishError                         // the engine failed it
)

func (f FinishReason) String() string {
	return [...]string{"none", "length", "stop", "cancelled", "timeout", "error"}[f]
}

// TokenLogprob is a token and its log-probability.
type TokenLogprob struct {
	Token   int
	Logprob float32
}

// Usage counts a request's tokens so far.
type Usage struct{ PromptTokens, CompletionTokens int }

// Event is one sampled token (Token >= 0, Text what it released) or the end of the request
// (Finish != FinishNone; it may carry the last token too).
type Event struct {
	Token       int
	Text        string
	Finish      FinishReason
	StopReason  string // the stop string that ended it
	HasLogprob  bool
	Logprob     float32
	TopLogprobs []TokenLogprob
	Usage       Usage
}

// Stream is one request's events, in order. Recv from one goroutine.
type Stream struct {
	e   *engine
	id  uint64
	ctx context.Context

	mu     sync.Mutex
	queue  []Event
	done   bool
	err    error
	wake   chan struct{} // cap 1: something was pushed, or the baton passed to this reader
	finCh  chan struct{} // closed at the end (stops the context watcher)
	closed sync.Once

	promoted bool // e.lmu: the baton was passed to this stream's waiting reader
}

// Generate submits a request (Prompt or Messages) and returns its stream. Bad input is an
// *Error with CodeInvalidArgument at once; the engine keeps serving. ctx cancels the request in
// the engine; its deadline is the request's timeout.
func (e *Engine) Generate(ctx context.Context, req Request) (*Stream, error) {
	return e.e.submit(ctx, req)
}

// Chat submits a conversation (req.Messages replaced by messages).
func (e *Engine) Chat(ctx context.Context, messages []Message, req Request) (*Stream, error) {
	req.Prompt = ""
	req.Messages = messages
	return e.e.submit(ctx, req)
}

// cArena holds the C copies of a request's strings until the submit returns.
type cArena []unsafe.Pointer

func (a *cArena) str(s string) *C.char {
	p := C.CString(s)
	*a = append(*a, unsafe.Pointer(p))
	return p
}

func (a *cArena) free() {
	for _, p := range *a {
		C.free(p)
	}
}

func (e *engine) submit(ctx context.Context, req Request) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, contextError(err, "the request's context ended before it was submitted")
	}
	var o C.ss_request_options
	C.ss_request_options_init(&o)
	var a cArena
	defer a.free()
	if req.Messages != nil {
		msgs := (*C.ss_message)(C.malloc(C.size_t(len(req.Messages)+1) * C.size_t(unsafe.Sizeof(C.ss_message{}))))
		a = append(a, unsafe.Pointer(msgs))
		ms := unsafe.Slice(msgs, len(req.Messages))
		for i, m := range req.Messages {
			ms[i].role = a.str(m.Role)
			ms[i].content = a.str(m.Content)
		}
		o.messages = msgs
		o.num_messages = C.size_t(len(req.Messages))
		if req.Prompt != "" {
			return nil, &Error{Code: CodeInvalidArgument, Message: "give Prompt or Messages, not both"}
		}
	} else {
		o.prompt = a.str(req.Prompt)
	}
	if req.MaxTokens != 0 {
		o.max_tokens = C.int32_t(req.MaxTokens)
	}
	o.min_tokens = C.int32_t(req.MinTokens)
	o.temperature = C.float(req.Temperature)
	if req.TopP != 0 {
		o.top_p = C.float(req.TopP)
	}
	o.top_k = C.int32_t(req.TopK)
	o.min_p = C.float(req.MinP)
	if req.RepetitionPenalty != 0 {
		o.repetition_penalty = C.float(req.RepetitionPenalty)
	}
	o.presence_penalty = C.float(req.PresencePenalty)
	o.frequency_penalty = C.float(req.FrequencyPenalty)
	o.seed = C.int64_t(req.Seed)
	if len(req.Stop) > 0 {
		stops := (**C.char)(C.malloc(C.size_t(len(req.Stop)) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
		a = append(a, unsafe.Pointer(stops))
		ss := unsafe.Slice(stops, len(req.Stop))
		for i, s := range req.Stop {
			ss[i] = a.str(s)
		}
		o.stop = stops
		o.num_stop = C.size_t(len(req.Stop))
	}
	if req.IgnoreEOS {
		o.ignore_eos = 1
	}
	if req.Logprobs {
		o.logprobs = C.int32_t(req.TopLogprobs)
	}
	if req.JSONSchema != "" {
		o.json_schema = a.str(req.JSONSchema)
	}
	if req.Regex != "" {
		o.regex = a.str(req.Regex)
	}
	if req.Grammar != "" {
		o.grammar = a.str(req.Grammar)
	}
	if req.ExtraJSON != "" {
		o.extra_json = a.str(req.ExtraJSON)
	}
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d).Seconds()
		if left <= 0 {
			return nil, contextError(context.DeadlineExceeded, "the request's deadline passed before it was submitted")
		}
		o.timeout_s = C.double(left)
	}

	s := &Stream{e: e, ctx: ctx, wake: make(chan struct{}, 1), finCh: make(chan struct{})}
	e.mu.RLock()
	if e.closed || e.c == nil {
		e.mu.RUnlock()
		return nil, &Error{Code: CodeClosed, Message: "the engine is closed"}
	}
	// The stream is registered under its key before the engine can produce an event for it.
	key := atomic.AddUint64(&e.nextKey, 1)
	o.user_data = C.uint64_t(key)
	e.streams.Store(key, s)
	var id C.uint64_t
	var g C.go_err
	st := C.go_submit(e.c, &o, &id, &g)
	e.mu.RUnlock()
	if st != C.SS_OK {
		e.streams.Delete(key)
		return nil, takeError(&g)
	}
	s.id = uint64(id)
	if ctx.Done() != nil {
		go s.watch()
	}
	return s, nil
}

// watch cancels the request in the engine when its context ends first.
func (s *Stream) watch() {
	select {
	case <-s.ctx.Done():
		s.cancel()
	case <-s.finCh:
	}
}

func (s *Stream) cancel() {
	s.e.mu.RLock()
	defer s.e.mu.RUnlock()
	if s.e.c != nil && !s.e.closed {
		C.ss_engine_cancel(s.e.c, C.uint64_t(s.id))
	}
}

func contextError(err error, msg string) *Error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: CodeDeadlineExceeded, Message: msg, cause: err}
	}
	return &Error{Code: CodeCancelled, Message: msg, cause: err}
}

// finishError is the error a finished request reports (nil for Length and Stop). A request its
// context ended reports the context's reason, whichever of the engine's timeout and the
// cancellation came first.
func (s *Stream) finishError(f FinishReason, code Code, msg string) error {
	switch f {
	case FinishLength, FinishStop:
		return nil
	case FinishCancelled, FinishTimeout:
		if err := s.ctx.Err(); err != nil {
			return contextError(err, "the request's context ended: "+err.Error())
		}
		if f == FinishTimeout {
			return &Error{Code: CodeDeadlineExceeded, Message: msg, cause: context.DeadlineExceeded}
		}
		return &Error{Code: CodeCancelled, Message: msg}
	default:
		if code == CodeOK {
			code = CodeInternal
		}
		return &Error{Code: code, Message: msg}
	}
}

func (s *Stream) push(ev Event, err error) {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	s.queue = append(s.queue, ev)
	if ev.Finish != FinishNone {
		s.endLocked(err)
	}
	s.mu.Unlock()
	s.notify()
}

// finish ends the stream without an event (the engine failed or closed).
func (s *Stream) finish(err error) {
	s.mu.Lock()
	if !s.done {
		s.endLocked(err)
	}
	s.mu.Unlock()
	s.notify()
}

// endLocked marks the stream ended with err (s.mu held).
func (s *Stream) endLocked(err error) {
	s.done = true
	s.err = err
	s.closed.Do(func() { close(s.finCh) })
}

// notify wakes a reader blocked in Recv, if any (never blocks).
func (s *Stream) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// hasNews says whether Recv would return now.
func (s *Stream) hasNews() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue) > 0 || s.done
}

// Recv returns the next event. The request's last event has Finish set; after it Recv returns
// io.EOF when the request ended normally (length, stop), else its *Error (cancelled, deadline
// exceeded, engine failure).
func (s *Stream) Recv() (Event, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			ev := s.queue[0]
			s.queue[0] = Event{}
			if len(s.queue) == 1 {
				s.queue = s.queue[:0] // the next push reuses the array
			} else {
				s.queue = s.queue[1:]
			}
			s.mu.Unlock()
			return ev, nil
		}
		if s.done {
			err := s.err
			s.mu.Unlock()
			if err == nil {
				err = io.EOF
			}
			return Event{}, err
		}
		s.mu.Unlock()
		if s.e.readersPoll {
			s.e.await(s)
		} else {
			<-s.wake
		}
	}
}

// ID is the engine's id of the request.
func (s *Stream) ID() uint64 { return s.id }

// Cancel ends the request in the engine (as cancelling its context does).
func (s *Stream) Cancel() { s.cancel() }

// Result is a whole request's output.
type Result struct {
	Text       string
	Tokens     []int
	Finish     FinishReason
	StopReason string
	Usage      Usage
}

// Collect reads the stream to its end.
func (s *Stream) Collect() (Result, error) {
	var r Result
	var b strings.Builder
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			r.Text = b.String()
			return r, nil
		}
		if err != nil {
			r.Text = b.String()
			return r, err
		}
		b.WriteString(ev.Text)
		if ev.Token >= 0 {
			r.Tokens = append(r.Tokens, ev.Token)
		}
		r.Usage = ev.Usage
		if ev.Finish != FinishNone {
			r.Finish = ev.Finish
			r.StopReason = ev.StopReason
		}
	}
}

/* selfserve.h — the stable C ABI of the selfserve inference engine (libselfserve.so).
 *
 * Plain C11. Nothing C++ crosses it: no exception escapes an ss_* function (each catches
 * everything), and only the types below appear. Handles are opaque; options structs start with
 * their own size (set by the *_init function) so fields can be added at the end without breaking
 * callers built against an older header.
 *
 * The flow: ss_model_load → ss_engine_create → ss_engine_submit (any number of requests, from any
 * thread) → ss_engine_poll in a loop on one thread (it runs the engine's steps and returns the
 * events of all requests at once) → ss_engine_cancel when a caller gives up → ss_engine_free,
 * ss_model_free.
 *
 * Errors: every function that can fail returns an ss_status; on failure ss_last_error() (a
 * thread-local object) holds the code, a message a person can act on, and the file:line where the
 * error arose (for CUDA failures the line of the failing CUDA call).
 *
 * Thread safety:
 *   - ss_model_*: a loaded model is read-only; ss_model_info may be called from any thread.
 *     ss_model_free may be called while engines still use the model (they hold a reference).
 *   - ss_engine_submit, ss_engine_cancel, ss_engine_wake and ss_engine_metrics are thread-safe.
 *   - ss_engine_poll: one thread at a time per engine (without own_thread it runs the forward
 *     passes on the calling thread: with CUDA, keep it on the thread that called ss_engine_create).
 *   - ss_engine_free: when no other call on that engine is in progress.
 *   - ss_last_error: per thread.
 */
#ifndef SELFSERVE_H
#define SELFSERVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SS_ABI_VERSION 1

/* ---- status codes (stable: values are never reused) -------------------------------------- */
typedef enum ss_status {
  SS_OK = 0,
  SS_ERR_INVALID_ARGUMENT = 1,  /* the caller's input: options, sampling values, JSON, prompt too long */
  SS_ERR_NOT_FOUND = 2,         /* a file that is not there */
  SS_ERR_INVALID_MODEL = 3,     /* a model file that is truncated, malformed or unsupported */
  SS_ERR_OUT_OF_MEMORY = 4,     /* host or device memory */
  SS_ERR_DEVICE_LOST = 5,       /* the GPU stopped answering (ECC, fell off the bus, busy/unavailable) */
  SS_ERR_LAUNCH_FAILURE = 6,    /* a kernel failed (illegal address, launch failure, timeout) */
  SS_ERR_DEVICE = 7,            /* any other CUDA / cuBLAS error */
  SS_ERR_UNAVAILABLE = 8,       /* the device asked for is not there (no GPU, built without CUDA) */
  SS_ERR_CANCELLED = 9,         /* the request was cancelled (ss_engine_cancel) */
  SS_ERR_DEADLINE_EXCEEDED = 10,/* the request's timeout passed */
  SS_ERR_INTERNAL = 11          /* a bug: please report the message */
} ss_status;

/* A stable name for a status ("SS_ERR_OUT_OF_MEMORY"); never NULL. */
const char* ss_status_name(int32_t status);

typedef struct ss_error {
  int32_t code;        /* an ss_status */
  const char* message; /* never NULL ("" before the first failure) */
  const char* file;    /* source file where the error arose, never NULL ("" when unknown) */
  int32_t line;
} ss_error;

/* The last error of the calling thread (successful calls leave it as it was); the pointer is the
 * thread's, its strings valid until the next failing ss_* call on this thread. */
const ss_error* ss_last_error(void);

/* "0.1.0" */
const char* ss_version(void);

/* ---- models -------------------------------------------------------------------------------- */
typedef struct ss_model ss_model;

typedef struct ss_model_options {
  size_t struct_size;       /* sizeof(ss_model_options) */
  const char* path;         /* GGUF file or Hugging Face folder; NULL or "": the default model
                               (SmolLM2-135M-Instruct, fetched into $SELFSERVE_HOME when missing) */
  int32_t check_values;     /* non-zero: scan every weight for NaN/Inf (slow on big models) */
  const char* sha256;       /* optional: hex digest the file must have */
} ss_model_options;

void ss_model_options_init(ss_model_options* opts);

/* Loads and validates a model; an error names the file, the tensor and the problem. */
ss_status ss_model_load(const ss_model_options* opts, ss_model** out);
/* Loads, validates (weights scanned for NaN/Inf) and frees: the verdict only. */
ss_status ss_model_validate(const ss_model_options* opts);
void ss_model_free(ss_model* model); /* NULL is fine */

typedef struct ss_model_info {
  size_t struct_size;       /* sizeof(ss_model_info), set by the caller */
  const char* path;         /* valid while the model lives */
  const char* architecture; /* e.g. "llama" */
  int32_t vocab_size;
  int32_t max_context;      /* 0: unknown */
  int32_t n_layers;
  int32_t eos_token;        /* -1: none */
} ss_model_info;

ss_status ss_model_info_get(const ss_model* model, ss_model_info* out);
/* The default model's path (not fetched); the string is the library's, valid forever. */
const char* ss_default_model_path(void);

/* ---- engines ------------------------------------------------------------------------------- */
typedef struct ss_engine ss_engine;

typedef enum ss_device { SS_DEVICE_AUTO = 0, SS_DEVICE_CPU = 1, SS_DEVICE_CUDA = 2 } ss_device;
typedef enum ss_kv_dtype { SS_KV_F16 = 0, SS_KV_F32 = 1, SS_KV_Q8_0 = 2 } ss_kv_dtype;

typedef struct ss_engine_options {
  size_t struct_size;             /* sizeof(ss_engine_options) */
  int32_t device;                 /* ss_device; AUTO: CUDA when a usable GPU is present */
  int32_t threads;                /* CPU threads for the forward pass; 0: all cores */
  int32_t max_num_seqs;           /* sequences per step (32) */
  int32_t max_num_batched_tokens; /* tokens per step (512) */
  int32_t block_size;             /* tokens per KV block (16) */
  int32_t num_kv_blocks;          /* 0: from kv_cache_mib (CPU) or gpu_memory_utilization (CUDA) */
  double kv_cache_mib;            /* KV cache budget when num_kv_blocks is 0; 0: 512 on the CPU,
                                     gpu_memory_utilization's share of the GPU with CUDA */
  int32_t kv_dtype;               /* ss_kv_dtype (F16) */
  int32_t max_model_len;          /* prompt + max_tokens limit; 0: the model's context and the cache */
  int32_t enable_prefix_caching;  /* non-zero: reuse cached prompt prefixes (1) */
  double gpu_memory_utilization;  /* CUDA: share of the GPU's memory to take (0.9) */
  int32_t enforce_eager;          /* CUDA: no CUDA graphs */
  /* 0: the steps run inside ss_engine_poll, on the polling thread (a caller that owns the thread
   * the device is driven from). Non-zero: the engine steps on a thread of its own, back to back
   * while there is work, and ss_engine_poll only collects events (the caller's latency never
   * delays a step). Either way a poll returns whole steps' events. */
  int32_t own_thread;
  /* > 0: once a poll has events it goes on collecting (own_thread: waiting; else: stepping) for up
   * to this many microseconds more before it returns, so that each poll carries several steps'
   * events: fewer, larger batches (less per-poll cost for the caller) at that much added latency
   * per token. 0: a poll returns as soon as a step's events are ready. */
  int32_t poll_linger_us;
  /* CUDA, non-zero: a request's output is the same bits at any load, prompt chunking or preemption
   * (steps past 8 rows run 8 rows at a time: large batches and long prompts are slower; as the
   * server's --batch-invariant). The CPU backend always is. A caller built before this field
   * existed passes a smaller struct_size and gets 0. */
  int32_t batch_invariant;
} ss_engine_options;

void ss_engine_options_init(ss_engine_options* opts);

/* The engine holds a reference to the model. With CUDA and without own_thread, the thread that
 * calls this should be the one that polls. */
ss_status ss_engine_create(ss_model* model, const ss_engine_options* opts, ss_engine** out);
/* Frees the engine; unfinished requests are dropped without events. NULL is fine. */
void ss_engine_free(ss_engine* engine);
/* "cpu" or "cuda (NVIDIA H200, ...)" (", batch-invariant" after it with batch_invariant): which
 * backend runs; valid while the engine lives. */
const char* ss_engine_device(const ss_engine* engine);

/* ---- requests ------------------------------------------------------------------------------ */
typedef struct ss_message {
  const char* role;    /* "system", "user", "assistant", "tool" */
  const char* content;
} ss_message;

typedef struct ss_request_options {
  size_t struct_size;         /* sizeof(ss_request_options) */
  /* Exactly one of: a completion prompt, or a chat conversation (rendered with the model's chat
   * template, generation prompt appended). */
  const char* prompt;
  const ss_message* messages;
  size_t num_messages;
  int32_t max_tokens;         /* 256 */
  int32_t min_tokens;         /* no stop (id or string) before this many tokens (0) */
  float temperature;          /* 0: greedy (1) */
  float top_p;                /* (0, 1]; 1: off */
  int32_t top_k;              /* 0: off */
  float min_p;                /* 0: off */
  float repetition_penalty;   /* 1: off */
  float presence_penalty;     /* 0: off */
  float frequency_penalty;    /* 0: off */
  int64_t seed;               /* < 0: random; same seed, same text (batch-independent) */
  const char* const* stop;    /* stop strings: the text ends before the first that appears */
  size_t num_stop;
  int32_t ignore_eos;         /* non-zero: do not stop at the model's end-of-generation tokens */
  int32_t logprobs;           /* < 0: none; k in [0, 20]: each token's logprob and the top k */
  /* Structured output: at most one of these (the text is kept inside it). */
  const char* json_schema;    /* a JSON Schema (JSON text); "{}" : any JSON value */
  const char* regex;          /* ECMAScript syntax; the whole output matches it */
  const char* grammar;        /* GBNF (llama.cpp's), starting at 'root' */
  double timeout_s;           /* > 0: the request ends with SS_FINISH_TIMEOUT after this long */
  /* Optional: a JSON object of further OpenAI / vLLM request fields merged into the request
   * (response_format, logit_bias, stop_token_ids, tools, ...), validated as the HTTP server does. */
  const char* extra_json;
  uint64_t user_data;         /* echoed in every event of the request */
} ss_request_options;

void ss_request_options_init(ss_request_options* opts);

/* Validates and queues a request; *request_id names it in events and ss_engine_cancel. A bad value
 * is SS_ERR_INVALID_ARGUMENT with a message naming the field; the engine keeps serving. */
ss_status ss_engine_submit(ss_engine* engine, const ss_request_options* opts, uint64_t* request_id);
/* Ends the request before it samples another token: its last event (finish SS_FINISH_CANCELLED)
 * comes from the next poll, and its KV blocks are freed in that step. Unknown or finished ids are
 * a no-op (SS_OK). */
ss_status ss_engine_cancel(ss_engine* engine, uint64_t request_id);

/* ---- events -------------------------------------------------------------------------------- */
typedef enum ss_finish_reason {
  SS_FINISH_NONE = 0,      /* still running */
  SS_FINISH_LENGTH = 1,    /* max_tokens or the context reached */
  SS_FINISH_STOP = 2,      /* an end-of-generation token, a stop string, or the grammar completed */
  SS_FINISH_CANCELLED = 3, /* ss_engine_cancel */
  SS_FINISH_TIMEOUT = 4,   /* timeout_s passed */
  SS_FINISH_ERROR = 5      /* the engine failed this request: error_code and error_message say why */
} ss_finish_reason;

typedef struct ss_token_logprob {
  int32_t token;
  float logprob;
} ss_token_logprob;

/* One sampled token of one request, or its end. Pointers stay valid until the next ss_engine_poll
 * (or ss_engine_free) on the same engine. */
typedef struct ss_event {
  uint64_t request_id;
  uint64_t user_data;
  int32_t token;          /* the sampled token id; -1 on a finish without a token */
  int32_t finish;         /* ss_finish_reason: non-zero on the request's last event */
  const char* text;       /* UTF-8 released by this event (NUL-terminated; stop strings cut) */
  size_t text_len;
  int32_t has_logprob;
  float logprob;
  const ss_token_logprob* top_logprobs;  /* most likely first */
  int32_t num_top_logprobs;
  int32_t prompt_tokens;      /* usage so far */
  int32_t completion_tokens;
  int32_t error_code;         /* an ss_status when finish is ERROR / TIMEOUT / CANCELLED, else 0 */
  const char* error_message;  /* why, for finish ERROR; "" otherwise */
  const char* stop_reason;    /* the stop string that ended it, or NULL */
} ss_event;

/* Runs the engine's steps on the calling thread (own_thread: waits for the engine's thread) until
 * at least one event is ready or timeout_ms passes (< 0: no limit; 0: at most one step), then copies up to `capacity` events into `events`
 * (the rest wait for the next poll) and sets *count. event_size is sizeof(ss_event) as the caller
 * knows it. A step can run past the timeout. Fails only when the backend fails with no request to
 * report it to (each request in a failed step gets a SS_FINISH_ERROR event). */
ss_status ss_engine_poll(ss_engine* engine, ss_event* events, size_t event_size, size_t capacity, size_t* count,
                         int32_t timeout_ms);
/* Makes a poll that is waiting for work return now (with what it has); also makes the event fd
 * readable. */
void ss_engine_wake(ss_engine* engine);
/* A file descriptor (an eventfd, non-blocking) that becomes readable when events are waiting, for
 * callers that wait in their own event loop (epoll, Go's netpoller, libuv) and then call
 * ss_engine_poll with timeout 0. Reading it (8 bytes) re-arms it: read, then poll until empty.
 * The engine owns it (closed by ss_engine_free; dup it to keep a copy). Meant for own_thread
 * engines (otherwise only a poll makes progress); -1 when the platform has none. */
int ss_engine_event_fd(const ss_engine* engine);

/* ---- metrics ------------------------------------------------------------------------------- */
typedef struct ss_metrics {
  size_t struct_size;            /* sizeof(ss_metrics), set by the caller */
  int32_t num_running;
  int32_t num_waiting;           /* queued or preempted */
  int32_t kv_blocks_total;
  int32_t kv_blocks_used;        /* referenced by live requests */
  int32_t kv_blocks_cached;      /* in the prefix index */
  double kv_usage;               /* used / total */
  int64_t prompt_tokens;
  int64_t generation_tokens;
  int64_t finished_requests;
  int64_t preemptions;
  int64_t steps;
  int64_t decode_steps;          /* steps that only decoded: their count, wall time and tokens */
  double decode_step_seconds;
  int64_t decode_step_tokens;
  double prefix_hit_rate;
  int64_t polls;                 /* ss_engine_poll calls, and the events they returned */
  int64_t events;
} ss_metrics;

/* A snapshot taken after the last step. */
ss_status ss_engine_metrics(const ss_engine* engine, ss_metrics* out);

#ifdef __cplusplus
}
#endif

#endif /* SELFSERVE_H */

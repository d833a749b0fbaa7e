/* The C ABI from plain C11, both ways of driving an engine (steps inside the poll, or on the
 * engine's own thread): errors with their codes and origins, bad input that leaves the engine
 * serving, a batch of greedy requests (a request's tokens do not depend on what it is batched with:
 * the same prompt alone and among others gives the same tokens), stop strings, cancellation that
 * frees the request's KV blocks within one step, a timeout, and the poll's timeout when idle.
 * Needs the default model ($SELFSERVE_TEST_MODEL or the cache); exits 77 (skipped) without it. */
#define _POSIX_C_SOURCE 200809L
#include <selfserve.h>

#include <poll.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

#define MAX_TOKENS 64

typedef struct run {
  uint64_t id;
  int32_t tokens[MAX_TOKENS + 1];
  int n_tokens;
  char text[4096];
  size_t text_len;
  int32_t finish;
  int32_t error_code;
  int32_t completion_tokens;
  int64_t steps_at_cancel;
  int events_after_cancel;
  int cancelled;
} run;

static double now_s(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static run* find(run* runs, int n, uint64_t id) {
  for (int i = 0; i < n; ++i)
    if (runs[i].id == id) return &runs[i];
  return NULL;
}

/* Polls until every run has finished; the user_data of each event must be its run's index. */
static void drain(ss_engine* e, run* runs, int n) {
  ss_event ev[8]; /* small on purpose: more events than fit wait for the next poll */
  int open = n;
  double give_up = now_s() + 300;
  while (open > 0 && now_s() < give_up) {
    size_t count = 0;
    ss_status st = ss_engine_poll(e, ev, sizeof(ss_event), 8, &count, 1000);
    CHECK(st == SS_OK);
    if (st != SS_OK) return;
    for (size_t i = 0; i < count; ++i) {
      run* r = find(runs, n, ev[i].request_id);
      CHECK(r != NULL);
      if (!r) continue;
      CHECK(ev[i].user_data == (uint64_t)(r - runs));
      CHECK(r->finish == SS_FINISH_NONE); /* nothing after the last event */
      if (r->cancelled) r->events_after_cancel++;
      if (ev[i].token >= 0 && r->n_tokens < MAX_TOKENS + 1) r->tokens[r->n_tokens++] = ev[i].token;
      CHECK(ev[i].text != NULL && strlen(ev[i].text) == ev[i].text_len);
      if (r->text_len + ev[i].text_len < sizeof(r->text)) {
        memcpy(r->text + r->text_len, ev[i].text, ev[i].text_len);
        r->text_len += ev[i].text_len;
        r->text[r->text_len] = 0;
      }
      r->completion_tokens = ev[i].completion_tokens;
      if (ev[i].finish != SS_FINISH_NONE) {
        r->finish = ev[i].finish;
        r->error_code = ev[i].error_code;
        --open;
      }
    }
  }
  CHECK(open == 0);
}

static ss_status submit_text(ss_engine* e, const char* prompt, int max_tokens, uint64_t user_data, uint64_t* id) {
  ss_request_options o;
  ss_request_options_init(&o);
  o.prompt = prompt;
  o.max_tokens = max_tokens;
  o.temperature = 0;
  o.ignore_eos = 1;
  o.user_data = user_data;
  return ss_engine_submit(e, &o, id);
}

static void test_errors_without_a_model(void) {
  ss_model_options mo;
  ss_model_options_init(&mo);
  mo.path = "/nonexistent/model.gguf";
  ss_model* m = (ss_model*)0x1;
  CHECK(ss_model_load(&mo, &m) == SS_ERR_NOT_FOUND);
  CHECK(m == NULL);
  const ss_error* err = ss_last_error();
  CHECK(err->code == SS_ERR_NOT_FOUND);
  CHECK(strstr(err->message, "/nonexistent/model.gguf") != NULL);
  CHECK(strstr(err->file, "capi") != NULL && err->line > 0);
  CHECK(strcmp(ss_status_name(SS_ERR_NOT_FOUND), "SS_ERR_NOT_FOUND") == 0);
  CHECK(strcmp(ss_status_name(12345), "SS_ERR_UNKNOWN") == 0);
  /* An options struct that was never initialised. */
  ss_model_options raw;
  memset(&raw, 0, sizeof raw);
  CHECK(ss_model_load(&raw, &m) == SS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ss_last_error()->message, "struct_size") != NULL);
  CHECK(ss_model_load(NULL, &m) == SS_ERR_INVALID_ARGUMENT);
  ss_model_free(NULL);
  ss_engine_free(NULL);
}

/* The first megabyte of a real model: a truncated file must be refused by name. */
static void test_truncated_model(const char* path) {
  FILE* in = fopen(path, "rb");
  CHECK(in != NULL);
  if (!in) return;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, in);
  fclose(in);
  const char* out_path = "/tmp/ss_capi_truncated.gguf";
  FILE* out = fopen(out_path, "wb");
  CHECK(out != NULL);
  if (!out) return;
  fwrite(buf, 1, n, out);
  fclose(out);
  ss_model_options mo;
  ss_model_options_init(&mo);
  mo.path = out_path;
  ss_model* m = NULL;
  CHECK(ss_model_load(&mo, &m) == SS_ERR_INVALID_MODEL);
  CHECK(m == NULL);
  CHECK(strstr(ss_last_error()->message, "ss_capi_truncated.gguf") != NULL);
  CHECK(ss_model_validate(&mo) == SS_ERR_INVALID_MODEL);
  remove(out_path);
}

static void test_bad_requests(ss_engine* e) {
  uint64_t id = 0;
  ss_request_options o;
  ss_request_options_init(&o);
  o.prompt = "Hello";
  o.temperature = -1;
  CHECK(ss_engine_submit(e, &o, &id) == SS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ss_last_error()->message, "temperature") != NULL);
  CHECK(id == 0);

  ss_request_options_init(&o);
  o.prompt = "Hello";
  o.top_p = 1.5f;
  CHECK(ss_engine_submit(e, &o, &id) == SS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ss_last_error()->message, "top_p") != NULL);

  ss_request_options_init(&o);
  o.prompt = "Hello";
  o.json_schema = "{\"type\": \"object\",";
  CHECK(ss_engine_submit(e, &o, &id) == SS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ss_last_error()->message, "json_schema") != NULL);

  ss_request_options_init(&o);
  o.prompt = "Hello";
  o.extra_json = "[1, 2";
  CHECK(ss_engine_submit(e, &o, &id) == SS_ERR_INVALID_ARGUMENT);

  ss_request_options_init(&o);
  o.prompt = "Hello";
  o.max_tokens = 1 << 30; /* far beyond the context */
  CHECK(ss_engine_submit(e, &o, &id) == SS_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ss_last_error()->message, "context") != NULL);

  ss_request_options_init(&o); /* neither prompt nor messages */
  CHECK(ss_engine_submit(e, &o, &id) == SS_ERR_INVALID_ARGUMENT);

  ss_message msgs[1] = {{"user", NULL}};
  ss_request_options_init(&o);
  o.messages = msgs;
  o.num_messages = 1;
  CHECK(ss_engine_submit(e, &o, &id) == SS_ERR_INVALID_ARGUMENT);
}

static void test_batch_independence(ss_engine* e) {
  /* Alone first, then the same prompt among three others of different lengths. */
  run solo[1];
  memset(solo, 0, sizeof solo);
  CHECK(submit_text(e, "The capital of France is", 24, 0, &solo[0].id) == SS_OK);
  drain(e, solo, 1);
  CHECK(solo[0].finish == SS_FINISH_LENGTH);
  CHECK(solo[0].n_tokens == 24 && solo[0].completion_tokens == 24);
  CHECK(solo[0].text_len > 0);

  const char* prompts[4] = {"Once upon a time", "The capital of France is", "1, 2, 3, 4,",
                            "A long, long prompt about the sea and the ships that sail on it every day"};
  run runs[4];
  memset(runs, 0, sizeof runs);
  for (int i = 0; i < 4; ++i) CHECK(submit_text(e, prompts[i], 24, (uint64_t)i, &runs[i].id) == SS_OK);
  drain(e, runs, 4);
  for (int i = 0; i < 4; ++i) CHECK(runs[i].finish == SS_FINISH_LENGTH && runs[i].n_tokens == 24);
  CHECK(memcmp(runs[1].tokens, solo[0].tokens, sizeof(int32_t) * 24) == 0);
  CHECK(strcmp(runs[1].text, solo[0].text) == 0);
}

static void test_stop_string(ss_engine* e, const char* first_text) {
  /* The greedy text's first few characters (from a word on) as a stop string: the text must end right before it. */
  if (strlen(first_text) < 8) return;
  char stop[8];
  memcpy(stop, first_text + 3, 4);
  stop[4] = 0;
  const char* stops[1] = {stop};
  ss_request_options o;
  ss_request_options_init(&o);
  o.prompt = "The capital of France is";
  o.max_tokens = 24;
  o.temperature = 0;
  o.ignore_eos = 1;
  o.stop = stops;
  o.num_stop = 1;
  run r[1];
  memset(r, 0, sizeof r);
  CHECK(ss_engine_submit(e, &o, &r[0].id) == SS_OK);
  drain(e, r, 1);
  CHECK(r[0].finish == SS_FINISH_STOP);
  const size_t at = (size_t)(strstr(first_text, stop) - first_text); /* its first appearance */
  CHECK(r[0].text_len == at && memcmp(r[0].text, first_text, at) == 0);
}

/* own_thread: the engine steps on while the test runs, so its end comes within two steps of the
 * cancel (the one in flight, then the one that stops it); polled, exactly the next step. */
static void test_cancel(ss_engine* e, int own_thread) {
  ss_metrics before;
  before.struct_size = sizeof before;
  CHECK(ss_engine_metrics(e, &before) == SS_OK);
  run r[1];
  memset(r, 0, sizeof r);
  CHECK(submit_text(e, "Tell me a long story about", 2000, 0, &r[0].id) == SS_OK);
  ss_event ev[4];
  /* Run until it has produced a few tokens. */
  while (r[0].n_tokens < 5) {
    size_t count = 0;
    CHECK(ss_engine_poll(e, ev, sizeof(ss_event), 4, &count, 1000) == SS_OK);
    for (size_t i = 0; i < count; ++i)
      if (ev[i].token >= 0) r[0].n_tokens++;
  }
  ss_metrics mid;
  mid.struct_size = sizeof mid;
  CHECK(ss_engine_metrics(e, &mid) == SS_OK);
  CHECK(mid.kv_blocks_used > 0 && mid.num_running == 1);
  CHECK(ss_engine_cancel(e, r[0].id) == SS_OK);
  int finished = 0, polls = 0;
  ss_event last;
  memset(&last, 0, sizeof last);
  while (!finished && polls++ < 1000) {
    size_t count = 0;
    CHECK(ss_engine_poll(e, ev, sizeof(ss_event), 4, &count, 1000) == SS_OK);
    for (size_t i = 0; i < count; ++i) {
      CHECK(ev[i].request_id == r[0].id);
      if (ev[i].finish) {
        finished = 1;
        last = ev[i];
      }
    }
    if (!own_thread) CHECK(count == 1 && finished); /* the very next poll carries its end */
  }
  CHECK(finished && last.token == -1);
  CHECK(last.finish == SS_FINISH_CANCELLED && last.error_code == SS_ERR_CANCELLED);
  ss_metrics after;
  after.struct_size = sizeof after;
  CHECK(ss_engine_metrics(e, &after) == SS_OK);
  if (own_thread) CHECK(after.steps - mid.steps <= 2);
  else CHECK(after.steps == mid.steps + 1);
  CHECK(after.kv_blocks_used == 0 && after.num_running == 0);
  CHECK(after.polls > mid.polls && after.events > before.events);
  /* Cancelling it again, or an id never given, is a no-op. */
  CHECK(ss_engine_cancel(e, r[0].id) == SS_OK);
  CHECK(ss_engine_cancel(e, 999999) == SS_OK);
}

static void test_timeout(ss_engine* e) {
  ss_request_options o;
  ss_request_options_init(&o);
  o.prompt = "Count to a thousand:";
  o.max_tokens = 2000;
  o.temperature = 0;
  o.ignore_eos = 1;
  o.timeout_s = 0.2;
  run r[1];
  memset(r, 0, sizeof r);
  const double t0 = now_s();
  CHECK(ss_engine_submit(e, &o, &r[0].id) == SS_OK);
  drain(e, r, 1);
  CHECK(r[0].finish == SS_FINISH_TIMEOUT && r[0].error_code == SS_ERR_DEADLINE_EXCEEDED);
  CHECK(r[0].n_tokens < 2000);
  CHECK(now_s() - t0 >= 0.2);
}

static void test_idle_poll(ss_engine* e) {
  ss_event ev[1];
  size_t count = 7;
  const double t0 = now_s();
  CHECK(ss_engine_poll(e, ev, sizeof(ss_event), 1, &count, 50) == SS_OK);
  const double waited = now_s() - t0;
  CHECK(count == 0);
  CHECK(waited >= 0.045 && waited < 2.0);
  CHECK(ss_engine_poll(e, ev, sizeof(ss_event), 1, NULL, 0) == SS_ERR_INVALID_ARGUMENT);
}

/* own_thread: wait on the event fd (as an event loop would), then collect with timeout 0. */
static void test_event_fd(ss_engine* e) {
  const int fd = ss_engine_event_fd(e);
  CHECK(fd >= 0);
  if (fd < 0) return;
  run r[1];
  memset(r, 0, sizeof r);
  CHECK(submit_text(e, "The capital of France is", 24, 0, &r[0].id) == SS_OK);
  ss_event ev[64];
  int wakeups = 0;
  while (r[0].finish == SS_FINISH_NONE && wakeups < 10000) {
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(poll(&p, 1, 5000) == 1); /* readable within 5 s: the engine publishes by itself */
    uint64_t counter;
    CHECK(read(fd, &counter, sizeof counter) == (ssize_t)sizeof counter && counter >= 1);
    ++wakeups;
    size_t count = 0;
    do {
      CHECK(ss_engine_poll(e, ev, sizeof(ss_event), 64, &count, 0) == SS_OK);
      for (size_t i = 0; i < count; ++i) {
        if (ev[i].token >= 0) r[0].n_tokens++;
        if (ev[i].finish) r[0].finish = ev[i].finish;
      }
    } while (count == 64);
  }
  CHECK(r[0].finish == SS_FINISH_LENGTH && r[0].n_tokens == 24);
  /* ss_engine_wake makes it readable without events. */
  ss_engine_wake(e);
  struct pollfd p = {fd, POLLIN, 0};
  CHECK(poll(&p, 1, 1000) == 1);
  uint64_t counter;
  CHECK(read(fd, &counter, sizeof counter) == (ssize_t)sizeof counter);
}

/* poll_linger_us: a poll that has events goes on gathering the next steps' (both driving modes). */
static void test_linger(ss_model* m, int own_thread) {
  ss_engine_options eo;
  ss_engine_options_init(&eo);
  eo.device = SS_DEVICE_CPU;
  eo.threads = 2;
  eo.kv_cache_mib = 16;
  eo.own_thread = own_thread;
  eo.poll_linger_us = 2000000;
  ss_engine* e = NULL;
  CHECK(ss_engine_create(m, &eo, &e) == SS_OK);
  if (!e) return;
  run r[1];
  memset(r, 0, sizeof r);
  CHECK(submit_text(e, "The capital of France is", 24, 0, &r[0].id) == SS_OK);
  ss_event ev[64];
  int polls_with_events = 0;
  while (r[0].finish == SS_FINISH_NONE) {
    size_t count = 0;
    CHECK(ss_engine_poll(e, ev, sizeof(ss_event), 64, &count, 5000) == SS_OK);
    if (count > 0) polls_with_events++;
    for (size_t i = 0; i < count; ++i) {
      if (ev[i].token >= 0) r[0].n_tokens++;
      if (ev[i].finish) r[0].finish = ev[i].finish;
    }
  }
  CHECK(r[0].n_tokens == 24);
  CHECK(polls_with_events * 2 <= r[0].n_tokens); /* several steps per poll */
  ss_engine_free(e);
}

static void test_chat(ss_engine* e) {
  ss_message msgs[2] = {{"system", "You are terse."}, {"user", "Say hello."}};
  ss_request_options o;
  ss_request_options_init(&o);
  o.messages = msgs;
  o.num_messages = 2;
  o.max_tokens = 16;
  o.temperature = 0;
  o.logprobs = 2;
  run r[1];
  memset(r, 0, sizeof r);
  CHECK(ss_engine_submit(e, &o, &r[0].id) == SS_OK);
  ss_event ev[8];
  int saw_logprobs = 0;
  while (r[0].finish == SS_FINISH_NONE) {
    size_t count = 0;
    CHECK(ss_engine_poll(e, ev, sizeof(ss_event), 8, &count, 1000) == SS_OK);
    for (size_t i = 0; i < count; ++i) {
      if (ev[i].token >= 0) {
        CHECK(ev[i].has_logprob && ev[i].logprob <= 0 && ev[i].num_top_logprobs == 2);
        /* Greedy: the chosen token is the most likely one. */
        CHECK(ev[i].top_logprobs != NULL && ev[i].top_logprobs[0].token == ev[i].token);
        saw_logprobs++;
      }
      if (ev[i].finish) r[0].finish = ev[i].finish;
    }
  }
  CHECK(saw_logprobs > 0);
  CHECK(r[0].finish == SS_FINISH_STOP || r[0].finish == SS_FINISH_LENGTH);
}

int main(void) {
  test_errors_without_a_model();
  const char* path = getenv("SELFSERVE_TEST_MODEL");
  if (!path || !*path) path = ss_default_model_path();
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "skipped: no model at %s (selfserve fetch)\n", path);
    return failures ? 1 : 77;
  }
  fclose(f);
  test_truncated_model(path);

  ss_model_options mo;
  ss_model_options_init(&mo);
  mo.path = path;
  ss_model* m = NULL;
  CHECK(ss_model_load(&mo, &m) == SS_OK);
  if (!m) return 1;
  ss_model_info info;
  info.struct_size = sizeof info;
  CHECK(ss_model_info_get(m, &info) == SS_OK);
  CHECK(info.vocab_size > 0 && info.n_layers > 0 && strlen(info.architecture) > 0);

  test_linger(m, 0);
  test_linger(m, 1);
  for (int own_thread = 0; own_thread <= 1; ++own_thread) {
    ss_engine_options eo;
    ss_engine_options_init(&eo);
    eo.device = SS_DEVICE_CPU;
    eo.threads = 2;
    eo.kv_cache_mib = 64;
    eo.enable_prefix_caching = 0;
    eo.own_thread = own_thread;
    eo.batch_invariant = own_thread; /* accepted on the CPU, whose rows always keep their bits */
    ss_engine* e = NULL;
    eo.max_num_seqs = 0;
    CHECK(ss_engine_create(m, &eo, &e) == SS_ERR_INVALID_ARGUMENT && e == NULL);
    eo.max_num_seqs = 8;
    CHECK(ss_engine_create(m, &eo, &e) == SS_OK);
    if (own_thread) ss_model_free(m); /* the engine holds its own reference */
    if (!e) return 1;
    CHECK(strcmp(ss_engine_device(e), "cpu") == 0);

    test_bad_requests(e);
    test_idle_poll(e);
    test_batch_independence(e);
    {
      run r[1];
      memset(r, 0, sizeof r);
      CHECK(submit_text(e, "The capital of France is", 24, 0, &r[0].id) == SS_OK);
      drain(e, r, 1);
      test_stop_string(e, r[0].text);
    }
    test_cancel(e, own_thread);
    test_timeout(e);
    test_chat(e);
    if (own_thread) test_event_fd(e);
    test_bad_requests(e); /* still serving after all of it */
    ss_engine_free(e);
  }
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("capi_test: all checks passed\n");
  return failures ? 1 : 0;
}

// selfserve serve: the OpenAI-compatible HTTP server. The port is bound first (so /health answers
// 503 while the model loads and warms up), then the engine starts and the API opens.
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/memory_options.h"
#include "engine/engine.h"
#include "engine/resident_executor.h"
#include "server/server.h"
#include "structured/structured.h"
#include "telemetry/telemetry.h"
#include "tokenizer/tokenizer.h"

namespace ss::cli {
namespace {

// Prefill tokens per step while streams decode. On the 2-core CPU a 512-token chunk of a long prompt
// costs 150-300 ms and every decoding stream waits for it; measured in docs/perf/serving.md.
constexpr int kDefaultPrefillWithDecodes = 128;

struct ServeArgs {
  std::string model;
  std::string served_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int long_prompt_threshold = 256;
  int max_prefill_with_decodes = kDefaultPrefillWithDecodes;
  int max_model_len = 0;
  int max_waiting = 256;
  double request_timeout = 600;
  double shutdown_timeout = 30;
  double watchdog = 60;
  double max_body_mib = 4;
  int max_connections = 1024;
  double max_buffered_body_mib = 256;
  double header_timeout = 10;
  bool metrics_require_key = false;
  bool no_prefix_caching = false;
  std::string scheduling = "host";
  bool log_requests = false;
  std::string log_format = "text";
  bool no_access_log = false;
  bool log_prompts = false;
  std::string otlp_endpoint;
  double otlp_sample_ratio = 1.0;
  bool quiet = false;
  MemoryArgs mem;  // threads, seats, batch, KV cache, --memory-mode, tiers, device
};

// Idle and streaming connections each hold a descriptor: lift the soft limit to the hard one.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
}

void run_serve(const ServeArgs& a) {
  raise_fd_limit();
  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.max_waiting = a.max_waiting;
  so.max_num_seqs = a.mem.max_num_seqs;
  so.request_timeout_s = a.request_timeout;
  so.shutdown_timeout_s = a.shutdown_timeout;
  so.watchdog_s = a.watchdog;
  so.max_body_bytes = static_cast<size_t>(a.max_body_mib * 1048576.0);
  so.max_connections = a.max_connections;
  so.max_buffered_body_bytes = static_cast<size_t>(a.max_buffered_body_mib * 1048576.0);
  so.header_timeout_s = a.header_timeout;
  so.metrics_require_key = a.metrics_require_key;
  so.log_requests = a.log_requests;
  so.access_log = !a.no_access_log;
  so.log_prompts = a.log_prompts;
  so.otlp_sample_ratio = a.otlp_sample_ratio;
  if (!a.otlp_endpoint.empty()) {
    telemetry::ExporterOptions eo;
    eo.endpoint = a.otlp_endpoint;
    eo.scope_version = SELFSERVE_VERSION;
    eo.resource = {{"service.name", std::string("selfserve")}, {"service.version", std::string(SELFSERVE_VERSION)}};
    auto ex = telemetry::OtlpExporter::create(std::move(eo));
    if (!ex.ok()) return fail(ex.message());
    so.tracer = std::move(ex).value();
  }
  auto srv = server::Server::create(so);
  if (!srv.ok()) return fail(srv.message());
  std::unique_ptr<server::Server> server = std::move(srv).value();
  telemetry::log_info("server", "listening on http://" + a.host + ":" + std::to_string(server->port()) +
                                    " (loading the model; /health is 503 until ready)");
  if (so.tracer)
    telemetry::log_info("otlp", "exporting traces to " + so.tracer->endpoint() + " (sample ratio " +
                                    std::to_string(a.otlp_sample_ratio) + ")");
  std::thread io([&] {
    pthread_setname_np(pthread_self(), "ss-http");  // named so its CPU time can be told apart
    (void)server->run();
  });
  struct Join {
    std::thread& t;
    server::Server& s;
    bool failed = false;
    ~Join() {
      if (failed) s.shutdown();
      if (t.joinable()) t.join();
    }
  } join{io, *server};

  // Model, backend, engine. Any failure stops the listener and exits 1.
  // JSON logs: every stderr line is a record, so no progress bar.
  auto m = open_model(a.model, {}, a.quiet || a.log_format == "json");
  if (!m.ok()) {
    join.failed = true;
    return fail(m.message());
  }
  std::unique_ptr<model::Model> model = std::move(m).value();
  const model::ModelConfig& mc = model->config;
  const int ctx = mc.max_context > 0 ? mc.max_context : 4096;

  auto plan = plan_memory(mc, a.mem, a.quiet, model->file_bytes);
  if (!plan.ok()) {
    join.failed = true;
    return fail(plan.message());
  }
  server->set_memory_mode_info(memory_mode_labels(*plan));
  backend::BackendOptions bo = plan->backend;
  // Persistent scheduling: the loop's --max-num-seqs seats plus the host executor's reserve.
  if (a.scheduling == "persistent") bo.max_slots = engine::persistent_backend_slots(a.mem.max_num_seqs);
  std::string device;
  auto be = make_backend(*model, bo, a.mem.device, &device);
  if (!be.ok()) {
    join.failed = true;
    return fail(be.message());
  }
  std::unique_ptr<backend::Backend> backend = std::move(be).value();
  const backend::KvCacheConfig kv = backend->kv_config();
  const int capacity = kv.num_blocks * kv.block_size;
  int max_len = std::min(ctx, capacity);
  if (a.max_model_len > 0) max_len = std::min(max_len, a.max_model_len);

  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = a.mem.max_num_seqs;
  ec.scheduler.max_num_batched_tokens = a.mem.max_num_batched_tokens;
  ec.scheduler.long_prompt_threshold = a.long_prompt_threshold;
  ec.scheduler.max_prefill_tokens_with_decodes = a.max_prefill_with_decodes;
  ec.scheduler.enable_prefix_caching = !a.no_prefix_caching;
  ec.scheduling = a.scheduling == "persistent" ? engine::EngineConfig::Scheduling::Persistent
                                               : engine::EngineConfig::Scheduling::Host;
  ec.scheduler.max_model_len = max_len;
  ec.scheduler.pressure = plan->pressure;
  ec.tiers = plan->tiers;
  if (!ec.tiers.disk_dir.empty()) {  // disk entries are bound to this exact model file
    auto h = engine::model_file_hash(model->path);
    if (!h.ok()) {
      join.failed = true;
      return fail(h.message());
    }
    ec.tiers.model_hash = *h;
  }
  // Level 3's CPU engine (--cpu-fallback): the same model and tokenizer on the CPU backend, its own
  // threads, KV pool and seats, no tiers; the router sends it new requests while the primary's pool
  // has no room. Built before the primary's engine, whose level 3 counts as having something below
  // only if it exists. Under auto a failure to build it is a warning (the server runs without it);
  // under on it is an error.
  std::unique_ptr<backend::Backend> fallback_backend;
  std::unique_ptr<engine::Engine> fallback;
  MemoryPlan::CpuFallback& fbp = plan->cpu_fallback;
  int fallback_max_len = 0;
  if (fbp.decision.enabled) {
    auto build = [&]() -> Status {
      SS_ASSIGN(auto fbe, backend::make_cpu_backend(*model, fbp.backend));
      fallback_backend = std::move(fbe);
      const backend::KvCacheConfig fkv = fallback_backend->kv_config();
      fallback_max_len = std::min(max_len, fkv.num_blocks * fkv.block_size);  // longer requests stay on the primary
      engine::EngineConfig fc;
      fc.scheduler = ec.scheduler;
      fc.scheduler.max_num_seqs = fbp.max_num_seqs;
      fc.scheduler.max_num_batched_tokens = std::max(a.mem.max_num_batched_tokens, fbp.max_num_seqs);
      fc.scheduler.max_model_len = fallback_max_len;
      fc.scheduler.pressure.has_lower_backend = false;  // nothing below the CPU
      SS_ASSIGN(auto fe, engine::Engine::create(*fallback_backend, fc));
      fallback = std::move(fe);
      return fallback->start();
    };
    if (auto st = build(); !st.ok()) {
      fallback.reset();
      fallback_backend.reset();
      if (fbp.mode == engine::CpuFallbackMode::On) {
        join.failed = true;
        return fail("--cpu-fallback on: the CPU engine could not start: " + st.message());
      }
      telemetry::log_warn("server", "--cpu-fallback auto: the CPU engine could not start (" + st.message() +
                                        "); serving without it");
      fbp.decision = {false, "off (auto: the CPU engine could not start: " + st.message() + ")"};
      plan->pressure.has_lower_backend = false;
      server->set_memory_mode_info(memory_mode_labels(*plan));
    }
  }
  // The fallback is stopped after the primary (declared before it).
  struct StopFallback {
    std::unique_ptr<engine::Engine>& e;
    ~StopFallback() {
      if (e) e->stop();
      e.reset();
    }
  } stop_fallback{fallback};
  ec.scheduler.pressure.has_lower_backend = fallback != nullptr;
  auto en = engine::Engine::create(*backend, ec);
  if (!en.ok()) {
    join.failed = true;
    return fail(en.message());
  }
  std::unique_ptr<engine::Engine> engine = std::move(en).value();
  // The engine goes first: its callbacks post into the server's event loop.
  struct StopEngine {
    std::unique_ptr<engine::Engine>& e;
    ~StopEngine() {
      if (e) e->stop();
      e.reset();
    }
  } stop_engine{engine};
  if (auto st = engine->start(); !st.ok()) {
    join.failed = true;
    return fail(st.message());
  }

  engine::EngineRouter router(*engine, fallback.get(), fbp.max_num_seqs);

  // Warm-up: one tiny request through the whole path (allocates the backend's scratch), on each engine.
  for (engine::Engine* warm : {engine.get(), fallback.get()}) {
    if (!warm) continue;
    auto q = std::make_shared<engine::EventQueue>();
    engine::Request r;
    r.prompt = {model->tokenizer->bos_id() >= 0 ? model->tokenizer->bos_id() : 0};
    r.max_tokens = 2;
    r.sampling.temperature = 0;
    r.on_event = engine::EventQueue::sink(q);
    auto id = warm->add_request(std::move(r));
    if (!id.ok()) {
      join.failed = true;
      return fail("warm-up: " + id.message());
    }
    engine::TokenEvent e;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    while (std::chrono::steady_clock::now() < give_up && !server->shutting_down()) {
      if (q->pop(e, std::chrono::milliseconds(100)) && e.finish != engine::FinishReason::None) break;
    }
    if (e.finish == engine::FinishReason::Error) {
      join.failed = true;
      return fail("warm-up failed: " + e.error);
    }
  }

  if (server->shutting_down()) {  // SIGTERM/SIGINT while loading: nothing to serve
    telemetry::log_info("server", "stopped before the model was ready");
    return;
  }
  server::ModelInfo mi;
  mi.id = a.served_name;
  if (mi.id.empty()) {
    std::filesystem::path p(model->path);
    mi.id = p.has_extension() && p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
    if (mi.id.empty()) mi.id = mc.name.empty() ? "selfserve" : mc.name;
  }
  mi.max_model_len = max_len;
  mi.vocab_size = mc.vocab_size;
  mi.tokenizer = model->tokenizer.get();
  mi.vocab_trie = structured::TokenTrie::build(*model->tokenizer);  // structured outputs walk it per state
  mi.grammar_cache = std::make_shared<structured::GrammarCache>();
  mi.chat_template = !model->chat_template.empty() ? model->chat_template : model->tokenizer->chat_template();
  mi.created = static_cast<int64_t>(std::time(nullptr));
  server->set_ready(router, mi);
  {
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "serving '%s' on http://%s:%d — %d KV blocks of %d tokens (%s), max_model_len %d, "
                  "max_num_seqs %d, %s; device %s",
                  mi.id.c_str(), a.host.c_str(), server->port(), kv.num_blocks, kv.block_size,
                  backend::kv_dtype_name(kv.dtype), max_len, a.mem.max_num_seqs, backend->name().c_str(), device.c_str());
    telemetry::log_info("server", msg);
    telemetry::log_info("server", "forward-pass threads " + std::to_string(bo.threads) + " (" + plan->threads_source +
                                      ")");
    telemetry::log_info("server", memory_mode_line(*plan));
    telemetry::log_info("server", "scheduling: " + engine->executor_name());
    std::string fb_line = "CPU fallback for pressure level 3: " + fbp.decision.why;
    if (fallback) {
      const backend::KvCacheConfig fkv = fallback_backend->kv_config();
      std::snprintf(msg, sizeof msg, "; %s, %d KV blocks of %d tokens (%s), max_num_seqs %d, max_model_len %d",
                    fallback_backend->name().c_str(), fkv.num_blocks, fkv.block_size,
                    backend::kv_dtype_name(fkv.dtype), fbp.max_num_seqs, fallback_max_len);
      fb_line += msg;
    }
    telemetry::log_info("server", fb_line);
    if (ec.tiers.enabled()) {
      std::snprintf(msg, sizeof msg, "KV tiers: host %lld bytes%s, disk %s (%lld bytes), idle TTL %lld ms",
                    static_cast<long long>(ec.tiers.host_bytes), ec.tiers.host_compress ? " (zstd)" : "",
                    ec.tiers.disk_dir.empty() ? "off" : ec.tiers.disk_dir.c_str(),
                    static_cast<long long>(ec.tiers.disk_bytes), static_cast<long long>(ec.tiers.ttl_ms));
      telemetry::log_info("server", msg);
    }
  }

  io.join();  // until SIGTERM/SIGINT and the drain
  telemetry::log_info("server", "stopped");
  set_exit_code(0);
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* c = app.add_subcommand("serve", "Serve the OpenAI-compatible HTTP API (completions, chat, streaming)");
  c->add_option("--model,-m", a->model, "GGUF file or Hugging Face folder (default: the embedded SmolLM2-135M)");
  c->add_option("--served-model-name", a->served_name, "Model id clients pass as \"model\" (default: the file name)");
  c->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  c->add_option("--port", a->port, "TCP port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  c->add_option("--api-key", a->api_key,
                "Require 'Authorization: Bearer KEY' on every route but /health (and /metrics: --metrics-require-key)");
  add_memory_options(c, &a->mem);
  c->add_option("--long-prompt-threshold", a->long_prompt_threshold, "Prompts this long wait in the long lane")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  c->add_option("--max-prefill-tokens-with-decodes", a->max_prefill_with_decodes,
                "Prefill tokens per step while streams decode (bounds their time per token; 0: no cap)")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  c->add_option("--max-model-len", a->max_model_len, "Prompt + completion limit (default: the model's context, "
                                                     "capped by the KV cache)");
  c->add_option("--max-waiting", a->max_waiting, "Queued requests beyond the running seats; more get 429")
      ->check(CLI::Range(0, 1 << 20))->capture_default_str();
  c->add_option("--request-timeout", a->request_timeout, "Default per-request deadline in seconds (0: none)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  c->add_option("--shutdown-timeout", a->shutdown_timeout, "Seconds to drain on SIGTERM before cancelling")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  c->add_option("--watchdog", a->watchdog, "/health is 503 when the engine has work but no step ends for this long (s)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--max-body-mib", a->max_body_mib, "Largest request body; larger ones get 413")
      ->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--max-connections", a->max_connections, "Open HTTP connections; more get 503 + Retry-After")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  c->add_option("--max-buffered-body-mib", a->max_buffered_body_mib,
                "Request bodies held over all connections; a body past it gets 503 + Retry-After")
      ->check(CLI::PositiveNumber)->capture_default_str();
  c->add_option("--header-timeout", a->header_timeout,
                "Seconds for a request's headers to arrive (from its first byte; on a new connection, from accept)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  c->add_flag("--metrics-require-key", a->metrics_require_key, "With --api-key, /metrics needs the key too");
  c->add_flag("--no-prefix-caching", a->no_prefix_caching, "Disable prefix caching");
  c->add_option("--scheduling", a->scheduling,
                "host: the host executor plans every step; persistent: a resident loop admits, plans, stops and "
                "streams by itself (on the CPU backend its own thread; requests it cannot run yet -- penalties, "
                "logit bias, grammars, logprobs -- go to a host executor beside it)")
      ->check(CLI::IsMember({"host", "persistent"}))->capture_default_str();
  c->add_flag("--log-requests", a->log_requests, "Log each request on stderr as it arrives");
  c->add_option("--log-format", a->log_format, "stderr log lines: text, or json (one object a line: timestamp, level, "
                                               "component, message, request_id, trace_id, ...)")
      ->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  c->add_flag("--no-access-log", a->no_access_log, "No access line per answered request");
  c->add_flag("--log-prompts", a->log_prompts, "Put the prompt text in the access line (off: prompts never reach logs)");
  c->add_option("--otlp-traces-endpoint", a->otlp_endpoint,
                "Export a trace per generation request over OTLP/HTTP (protobuf), e.g. http://localhost:4318/v1/traces");
  c->add_option("--otlp-sample-ratio", a->otlp_sample_ratio,
                "Fraction of new traces recorded (a caller's traceparent decides for its own)")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  c->add_flag("--quiet,-q", a->quiet, "No progress output");
  c->callback([a] {
    if (auto f = telemetry::parse_log_format(a->log_format); f.ok()) telemetry::Logger::global().set_format(*f);
    if (a->mem.max_num_batched_tokens < a->mem.max_num_seqs)
      return fail("--max-num-batched-tokens must be >= --max-num-seqs");
    if (a->max_buffered_body_mib < a->max_body_mib) return fail("--max-buffered-body-mib must be >= --max-body-mib");
    run_serve(*a);
  });
}

}  // namespace ss::cli

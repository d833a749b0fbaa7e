// The C ABI (include/selfserve.h) over the engine. Every entry point catches everything: a C caller
// (or Go through cgo) must never see a C++ exception unwind into it. A request is parsed by the
// HTTP server's own parser (server/request_parse.h) from the JSON the options describe, so the
// library validates exactly as the server does; its events pass through the server's TextOutput
// (incremental UTF-8, stop strings) and are queued for ss_engine_poll, which runs the engine's steps
// on the polling thread and hands back every request's events in one call.
#include "selfserve.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "capi/errors.h"
#include "cli/default_model.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/request_parse.h"
#include "server/text_output.h"
#include "structured/structured.h"

using ss::capi::fail;
using ss::capi::fail_from;

struct ss_model {
  std::shared_ptr<ss::model::Model> m;
  std::string arch;
};

namespace {

using json = nlohmann::json;
namespace engine = ss::engine;

// One request as the engine thread (the poller) sees it.
struct Live {
  uint64_t id = 0;
  uint64_t user_data = 0;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  std::vector<int32_t> stop_ids;
  ss::server::TextOutput text;
  Live(const ss::tok::Tokenizer& tk, const ss::server::GenerationRequest& g)
      : text(tk, g.stop, g.skip_special_tokens, g.min_tokens, g.include_stop_str_in_output) {}
};

// An event as it waits in the queue; ss_event points into it once delivered.
struct Pending {
  uint64_t id = 0, user_data = 0;
  int32_t token = -1;
  int32_t finish = SS_FINISH_NONE;
  std::string text;
  bool has_logprob = false;
  float logprob = 0;
  std::vector<ss_token_logprob> top;
  int32_t prompt_tokens = 0, completion_tokens = 0;
  int32_t error_code = 0;
  std::string error_message;
  bool has_stop_reason = false;
  std::string stop_reason;
};

int32_t finish_code(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::None: return SS_FINISH_NONE;
    case engine::FinishReason::Length: return SS_FINISH_LENGTH;
    case engine::FinishReason::Stop: return SS_FINISH_STOP;
    case engine::FinishReason::Abort: return SS_FINISH_CANCELLED;
    case engine::FinishReason::Timeout: return SS_FINISH_TIMEOUT;
    case engine::FinishReason::Error: return SS_FINISH_ERROR;
  }
  return SS_FINISH_ERROR;
}

// The CUDA plugin is looked for beside the executable; a program that links libselfserve.so
// finds it beside the library instead (cmake --install puts both in the lib folder).
void point_at_cuda_plugin() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* env = std::getenv("SELFSERVE_CUDA_PLUGIN"); env && *env) return;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&ss_version), &info) == 0 || !info.dli_fname) return;
    std::error_code ec;
    const auto p = std::filesystem::path(info.dli_fname).parent_path() / "libselfserve_cuda.so";
    if (std::filesystem::exists(p, ec)) setenv("SELFSERVE_CUDA_PLUGIN", p.c_str(), 0);
  });
}

template <class T>
bool struct_ok(const T* opts, const char* what) {
  if (!opts) {
    fail(SS_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL", __FILE__, __LINE__);
    return false;
  }
  // Older callers pass a smaller struct (its fields are a prefix of ours); a zero or tiny size is a
  // struct that was never initialised.
  const size_t size = opts->struct_size;  // the first field of every options struct
  if (size < sizeof(size_t) || size > (size_t{1} << 20)) {
    fail(SS_ERR_INVALID_ARGUMENT,
         std::string(what) + ".struct_size is " + std::to_string(size) + ": call the _init function first",
         __FILE__, __LINE__);
    return false;
  }
  return true;
}

// Copies the caller's struct into a default-initialised one of ours: fields it does not know keep
// their defaults.
template <class T>
T widen(const T* in, void (*init)(T*)) {
  T out;
  init(&out);
  std::memcpy(&out, in, std::min(sizeof(T), in->struct_size));
  out.struct_size = sizeof(T);
  return out;
}

}  // namespace

struct ss_engine {
  std::shared_ptr<ss::model::Model> model;
  std::unique_ptr<ss::backend::Backend> backend;
  std::unique_ptr<engine::Engine> eng;
  ss::server::ModelInfo info;
  std::string device;

  // The stepping thread's (the poller, or the engine's own thread): the events of the step in
  // progress, published whole after it so that a poll takes a step's events in one batch.
  std::vector<Pending> staged;

  std::mutex mu;  // guards wakes and stopping: what the stepping thread waits for
  std::condition_variable cv;
  uint64_t wakes = 0;
  bool stopping = false;

  std::mutex qmu;  // guards pending, poll_wakes and step_error: what the poller waits for
  std::condition_variable qcv;
  std::deque<Pending> pending;
  uint64_t poll_wakes = 0;
  std::string step_error;  // a failed step nobody heard of (own thread), for the next poll

  std::vector<Pending> delivered;  // the poller's: what the last poll's ss_events point into
  bool own_thread = false;
  std::chrono::microseconds linger{0};
  std::thread stepper;

  int event_fd = -1;  // readable while events wait (ss_engine_event_fd)
  std::atomic<int64_t> polls{0}, events{0};
  std::atomic<uint64_t> next_id{1};  // request ids (never reused: unique among live ones)
  std::mt19937_64 seeder{std::random_device{}()};
  std::mutex seeder_mu;

  ~ss_engine() {
    if (stepper.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu);
        stopping = true;
      }
      cv.notify_all();
      stepper.join();
    }
    if (event_fd >= 0) close(event_fd);
  }

  void signal_fd() {
    if (event_fd < 0) return;
    const uint64_t one = 1;
    (void)!write(event_fd, &one, sizeof one);  // only fails when the counter is full: still readable
  }

  void notify() {  // new work (submit, cancel) or a wake-up
    {
      std::lock_guard<std::mutex> lk(mu);
      ++wakes;
    }
    cv.notify_all();
  }

  void wake_poller() {
    {
      std::lock_guard<std::mutex> lk(qmu);
      ++poll_wakes;
    }
    qcv.notify_all();
    signal_fd();
  }

  // One step, its events published. False: the step failed and no request heard of it (`why`).
  bool step_and_publish(std::string* why) {
    auto st = eng->step();
    bool heard = !staged.empty();
    bool was_empty;
    {
      std::lock_guard<std::mutex> lk(qmu);
      was_empty = pending.empty();
      for (Pending& p : staged) pending.push_back(std::move(p));
      if (!st.ok() && !heard) {
        if (own_thread) step_error = st.message();
        heard = own_thread;  // the poller reports it
      }
    }
    staged.clear();
    qcv.notify_all();
    // The fd says "something waits": once per empty-to-some transition (or a failure to report).
    if ((was_empty && heard) || (!st.ok() && own_thread)) signal_fd();
    if (!st.ok() && !heard) *why = st.message();
    return st.ok() || heard;
  }

  // The engine's own thread: steps while there is work, sleeps until a submit or cancel.
  void step_loop() {
    for (;;) {
      uint64_t seen;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (stopping) return;
        seen = wakes;
      }
      if (eng->has_work()) {
        std::string unused;
        (void)step_and_publish(&unused);
        continue;
      }
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return stopping || wakes != seen; });
    }
  }

  // Engine thread: one engine event → at most one queued event.
  void on_event(Live& r, const engine::TokenEvent& e) {
    // After a stop string only the finish event still counts (tokens a step ran ahead are surplus).
    const bool surplus = e.token >= 0 && r.text.stopped();
    if (surplus && e.finish == engine::FinishReason::None) return;
    Pending p;
    p.id = r.id;
    p.user_data = r.user_data;
    if (e.token >= 0 && !surplus) {
      p.token = e.token;
      ++r.completion_tokens;
      p.has_logprob = e.has_logprob;
      p.logprob = e.logprob;
      for (const auto& [t, lp] : e.top_logprobs) p.top.push_back({t, lp});
      // A stop id ends the text without being part of it.
      const bool stop_id = e.finish == engine::FinishReason::Stop &&
                           std::find(r.stop_ids.begin(), r.stop_ids.end(), e.token) != r.stop_ids.end();
      if (!stop_id && r.text.push(e.token) && e.finish == engine::FinishReason::None)
        eng->stop_request(r.id, engine::FinishReason::Stop);
    }
    p.text = r.text.take();
    if (e.finish != engine::FinishReason::None) {
      engine::FinishReason fin = e.finish;
      if (r.text.stopped() && fin != engine::FinishReason::Error && fin != engine::FinishReason::Abort)
        fin = engine::FinishReason::Stop;
      p.text += r.text.finish();
      p.finish = finish_code(fin);
      if (r.text.stopped()) {
        p.has_stop_reason = true;
        p.stop_reason = r.text.matched_stop();
      }
      if (fin == engine::FinishReason::Error) {
        p.error_message = e.error;
        p.error_code = ss::capi::classify(e.error, SS_ERR_INTERNAL);
        if (e.error.rfind(ss::backend::kConstraintErrorPrefix, 0) == 0) p.error_code = SS_ERR_INVALID_ARGUMENT;
      } else if (fin == engine::FinishReason::Timeout) {
        p.error_code = SS_ERR_DEADLINE_EXCEEDED;
        p.error_message = "the request's timeout passed";
      } else if (fin == engine::FinishReason::Abort) {
        p.error_code = SS_ERR_CANCELLED;
        p.error_message = "the request was cancelled";
      }
    }
    p.prompt_tokens = r.prompt_tokens;
    p.completion_tokens = r.completion_tokens;
    staged.push_back(std::move(p));
  }
};

// ---- errors, version --------------------------------------------------------------------------

extern "C" const char* ss_status_name(int32_t status) {
  switch (status) {
    case SS_OK: return "SS_OK";
    case SS_ERR_INVALID_ARGUMENT: return "SS_ERR_INVALID_ARGUMENT";
    case SS_ERR_NOT_FOUND: return "SS_ERR_NOT_FOUND";
    case SS_ERR_INVALID_MODEL: return "SS_ERR_INVALID_MODEL";
    case SS_ERR_OUT_OF_MEMORY: return "SS_ERR_OUT_OF_MEMORY";
    case SS_ERR_DEVICE_LOST: return "SS_ERR_DEVICE_LOST";
    case SS_ERR_LAUNCH_FAILURE: return "SS_ERR_LAUNCH_FAILURE";
    case SS_ERR_DEVICE: return "SS_ERR_DEVICE";
    case SS_ERR_UNAVAILABLE: return "SS_ERR_UNAVAILABLE";
    case SS_ERR_CANCELLED: return "SS_ERR_CANCELLED";
    case SS_ERR_DEADLINE_EXCEEDED: return "SS_ERR_DEADLINE_EXCEEDED";
    case SS_ERR_INTERNAL: return "SS_ERR_INTERNAL";
    default: return "SS_ERR_UNKNOWN";
  }
}

extern "C" const ss_error* ss_last_error(void) { return ss::capi::last_error(); }

extern "C" const char* ss_version(void) { return SELFSERVE_VERSION; }

// Every entry point's body runs inside this: exceptions become status codes.
#define SS_GUARD_BEGIN try {
#define SS_GUARD_END                                                                   \
  }                                                                                    \
  catch (const std::bad_alloc&) {                                                      \
    return fail(SS_ERR_OUT_OF_MEMORY, "out of memory (host)", __FILE__, __LINE__);     \
  }                                                                                    \
  catch (const std::exception& ex) {                                                   \
    return fail(SS_ERR_INTERNAL, std::string("internal error: ") + ex.what(), __FILE__, __LINE__); \
  }                                                                                    \
  catch (...) {                                                                        \
    return fail(SS_ERR_INTERNAL, "internal error: unknown exception", __FILE__, __LINE__); \
  }

// ---- models ----------------------------------------------------------------------------------

extern "C" void ss_model_options_init(ss_model_options* o) {
  if (!o) return;
  *o = ss_model_options{};
  o->struct_size = sizeof(ss_model_options);
}

namespace {
ss_status load(const ss_model_options* in, bool check_values, std::unique_ptr<ss::model::Model>* out) {
  if (!struct_ok(in, "ss_model_options")) return ss::capi::last_status();
  const ss_model_options o = widen(in, ss_model_options_init);
  std::string path = o.path ? o.path : "";
  if (path.empty()) {
    auto p = ss::cli::ensure_default_model(/*quiet=*/true);
    if (!p.ok()) return fail(SS_ERR_UNAVAILABLE, p.message(), __FILE__, __LINE__);
    path = *p;
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return fail(SS_ERR_NOT_FOUND, path + ": no such file or folder", __FILE__, __LINE__);
  ss::model::LoadOptions lo;
  lo.check_values = check_values || o.check_values != 0;
  if (o.sha256 && *o.sha256) lo.verify_sha256 = std::string(o.sha256);
  auto m = ss::model::load_model(path, lo);
  if (!m.ok()) return fail_from(m.message(), SS_ERR_INVALID_MODEL, __FILE__, __LINE__);
  *out = std::move(m).value();
  return SS_OK;
}
}  // namespace

extern "C" ss_status ss_model_load(const ss_model_options* opts, ss_model** out) {
  SS_GUARD_BEGIN
  if (!out) return fail(SS_ERR_INVALID_ARGUMENT, "out is NULL", __FILE__, __LINE__);
  *out = nullptr;
  std::unique_ptr<ss::model::Model> m;
  if (ss_status st = load(opts, false, &m); st != SS_OK) return st;
  if (!m->tokenizer) return fail(SS_ERR_INVALID_MODEL, m->path + ": the model has no tokenizer", __FILE__, __LINE__);
  auto h = std::make_unique<ss_model>();
  h->arch = ss::model::arch_name(m->config.arch);
  h->m = std::move(m);
  *out = h.release();
  return SS_OK;
  SS_GUARD_END
}

extern "C" ss_status ss_model_validate(const ss_model_options* opts) {
  SS_GUARD_BEGIN
  std::unique_ptr<ss::model::Model> m;
  return load(opts, true, &m);
  SS_GUARD_END
}

extern "C" void ss_model_free(ss_model* model) {
  try {
    delete model;
  } catch (...) {
  }
}

extern "C" ss_status ss_model_info_get(const ss_model* model, ss_model_info* out) {
  SS_GUARD_BEGIN
  if (!model) return fail(SS_ERR_INVALID_ARGUMENT, "model is NULL", __FILE__, __LINE__);
  if (!struct_ok(out, "ss_model_info")) return ss::capi::last_status();
  ss_model_info i{};
  i.struct_size = out->struct_size;
  i.path = model->m->path.c_str();
  i.architecture = model->arch.c_str();
  i.vocab_size = model->m->config.vocab_size;
  i.max_context = model->m->config.max_context;
  i.n_layers = model->m->config.n_layers;
  i.eos_token = model->m->tokenizer ? model->m->tokenizer->eos_id() : -1;
  std::memcpy(out, &i, std::min(sizeof(i), out->struct_size));
  return SS_OK;
  SS_GUARD_END
}

extern "C" const char* ss_default_model_path(void) {
  try {
    static const std::string p = ss::cli::default_model_path();
    return p.c_str();
  } catch (...) {
    return "";
  }
}

// ---- engines ---------------------------------------------------------------------------------

extern "C" void ss_engine_options_init(ss_engine_options* o) {
  if (!o) return;
  *o = ss_engine_options{};
  o->struct_size = sizeof(ss_engine_options);
  o->device = SS_DEVICE_AUTO;
  o->max_num_seqs = 32;
  o->max_num_batched_tokens = 512;
  o->block_size = 16;
  o->kv_dtype = SS_KV_F16;
  o->enable_prefix_caching = 1;
  o->gpu_memory_utilization = 0.9;
}

extern "C" ss_status ss_engine_create(ss_model* model, const ss_engine_options* in, ss_engine** out) {
  SS_GUARD_BEGIN
  if (!out) return fail(SS_ERR_INVALID_ARGUMENT, "out is NULL", __FILE__, __LINE__);
  *out = nullptr;
  if (!model) return fail(SS_ERR_INVALID_ARGUMENT, "model is NULL", __FILE__, __LINE__);
  if (!struct_ok(in, "ss_engine_options")) return ss::capi::last_status();
  const ss_engine_options o = widen(in, ss_engine_options_init);
  auto bad = [](const std::string& m) { return fail(SS_ERR_INVALID_ARGUMENT, m, __FILE__, __LINE__); };
  if (o.device < SS_DEVICE_AUTO || o.device > SS_DEVICE_CUDA) return bad("device must be SS_DEVICE_AUTO, _CPU or _CUDA");
  if (o.threads < 0) return bad("threads must be >= 0, got " + std::to_string(o.threads));
  if (o.max_num_seqs < 1 || o.max_num_seqs > 4096) return bad("max_num_seqs must be in [1, 4096]");
  if (o.max_num_batched_tokens < o.max_num_seqs) return bad("max_num_batched_tokens must be >= max_num_seqs");
  if (o.block_size < 1 || o.block_size > 1024) return bad("block_size must be in [1, 1024]");
  if (o.num_kv_blocks < 0) return bad("num_kv_blocks must be >= 0");
  if (!(o.kv_cache_mib >= 0)) return bad("kv_cache_mib must be >= 0");
  if (o.kv_dtype < SS_KV_F16 || o.kv_dtype > SS_KV_Q8_0) return bad("kv_dtype must be SS_KV_F16, _F32 or _Q8_0");
  if (o.max_model_len < 0) return bad("max_model_len must be >= 0");
  if (o.poll_linger_us < 0 || o.poll_linger_us > 10'000'000) return bad("poll_linger_us must be in [0, 10000000]");
  if (!(o.gpu_memory_utilization >= 0.05 && o.gpu_memory_utilization <= 1.0))
    return bad("gpu_memory_utilization must be in [0.05, 1]");

  auto e = std::make_unique<ss_engine>();
  e->model = model->m;
  const ss::model::Model& m = *e->model;
  const ss::model::ModelConfig& mc = m.config;
  using DT = ss::backend::KvCacheConfig::DType;
  ss::backend::BackendOptions bo;
  bo.threads = o.threads;
  bo.kv.block_size = o.block_size;
  bo.kv.dtype = o.kv_dtype == SS_KV_F32 ? DT::F32 : o.kv_dtype == SS_KV_Q8_0 ? DT::Q8 : DT::F16;
  bo.max_batch_tokens = o.max_num_batched_tokens;
  bo.max_slots = o.max_num_seqs;
  bo.gpu_memory_utilization = o.gpu_memory_utilization;
  bo.enforce_eager = o.enforce_eager != 0;
  bo.batch_invariant = o.batch_invariant != 0;
  point_at_cuda_plugin();
  const std::string gpu = o.device == SS_DEVICE_CPU ? std::string() : ss::backend::cuda_device_summary();
  const bool cuda = o.device == SS_DEVICE_CUDA || (o.device == SS_DEVICE_AUTO && !gpu.empty());
  if (o.num_kv_blocks > 0) {
    bo.kv.num_blocks = o.num_kv_blocks;
  } else if (cuda && o.kv_cache_mib <= 0) {
    bo.kv.num_blocks = 0;  // the GPU backend sizes its cache from gpu_memory_utilization
  } else {
    const int64_t block_bytes = ss::backend::cpu_kv_block_bytes(bo.kv, mc.n_layers, mc.n_kv_heads, mc.head_dim);
    const double mib = o.kv_cache_mib > 0 ? o.kv_cache_mib : 512;
    bo.kv.num_blocks = static_cast<int>(
        std::max<int64_t>(1, static_cast<int64_t>(mib * 1048576.0) / std::max<int64_t>(1, block_bytes)));
  }
  if (cuda) {
    if (o.device == SS_DEVICE_CUDA && gpu.empty())
      return fail(SS_ERR_UNAVAILABLE, "no usable CUDA device (no NVIDIA driver, no GPU, or built without CUDA)",
                  __FILE__, __LINE__);
    auto be = ss::backend::make_cuda_backend(m, bo);
    if (!be.ok()) return fail_from(be.message(), SS_ERR_DEVICE, __FILE__, __LINE__);
    e->backend = std::move(be).value();
    e->device = "cuda (" + gpu + ")" + (bo.batch_invariant ? ", batch-invariant" : "");
  } else {
    auto be = ss::backend::make_cpu_backend(m, bo);
    if (!be.ok()) return fail_from(be.message(), SS_ERR_INVALID_ARGUMENT, __FILE__, __LINE__);
    e->backend = std::move(be).value();
    e->device = "cpu";
  }
  const ss::backend::KvCacheConfig kv = e->backend->kv_config();
  const int ctx = mc.max_context > 0 ? mc.max_context : 4096;
  int max_len = std::min(ctx, kv.num_blocks * kv.block_size);
  if (o.max_model_len > 0) max_len = std::min(max_len, o.max_model_len);

  engine::EngineConfig ec;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.enable_prefix_caching = o.enable_prefix_caching != 0;
  ec.scheduler.max_model_len = max_len;
  auto en = engine::Engine::create(*e->backend, ec);
  if (!en.ok()) return fail_from(en.message(), SS_ERR_INVALID_ARGUMENT, __FILE__, __LINE__);
  e->eng = std::move(en).value();

  ss::server::ModelInfo& mi = e->info;
  mi.id = "selfserve";
  mi.max_model_len = max_len;
  mi.vocab_size = mc.vocab_size;
  mi.tokenizer = m.tokenizer.get();
  mi.vocab_trie = ss::structured::TokenTrie::build(*m.tokenizer);
  mi.grammar_cache = std::make_shared<ss::structured::GrammarCache>();
  mi.chat_template = !m.chat_template.empty() ? m.chat_template : m.tokenizer->chat_template();
  mi.max_choices = 1;
  e->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  e->own_thread = o.own_thread != 0;
  e->linger = std::chrono::microseconds(o.poll_linger_us);
  if (e->own_thread)
    e->stepper = std::thread([p = e.get()] {
      pthread_setname_np(pthread_self(), "ss-engine");  // for top, perf, and the benchmarks' accounting
      p->step_loop();
    });
  *out = e.release();
  return SS_OK;
  SS_GUARD_END
}

extern "C" void ss_engine_free(ss_engine* engine) {
  try {
    delete engine;
  } catch (...) {
  }
}

extern "C" const char* ss_engine_device(const ss_engine* engine) { return engine ? engine->device.c_str() : ""; }

// ---- requests --------------------------------------------------------------------------------

extern "C" void ss_request_options_init(ss_request_options* o) {
  if (!o) return;
  *o = ss_request_options{};
  o->struct_size = sizeof(ss_request_options);
  o->max_tokens = 256;
  o->temperature = 1.0f;
  o->top_p = 1.0f;
  o->repetition_penalty = 1.0f;
  o->seed = -1;
  o->logprobs = -1;
}

namespace {
// A float as JSON: NaN and infinities have no JSON spelling, so they are refused here by name.
bool put_number(json& body, const char* name, float v, std::string* why) {
  if (!std::isfinite(v)) {
    *why = std::string("'") + name + "' must be a finite number";
    return false;
  }
  body[name] = static_cast<double>(v);
  return true;
}
}  // namespace

extern "C" ss_status ss_engine_submit(ss_engine* e, const ss_request_options* in, uint64_t* request_id) {
  SS_GUARD_BEGIN
  if (!e) return fail(SS_ERR_INVALID_ARGUMENT, "engine is NULL", __FILE__, __LINE__);
  if (!request_id) return fail(SS_ERR_INVALID_ARGUMENT, "request_id is NULL", __FILE__, __LINE__);
  *request_id = 0;
  if (!struct_ok(in, "ss_request_options")) return ss::capi::last_status();
  const ss_request_options o = widen(in, ss_request_options_init);
  auto bad = [](const std::string& m) { return fail(SS_ERR_INVALID_ARGUMENT, m, __FILE__, __LINE__); };

  const bool chat = o.messages != nullptr || o.num_messages > 0;
  if (chat == (o.prompt != nullptr)) return bad("give either prompt or messages (not both, not neither)");
  json body = json::object();
  if (o.extra_json && *o.extra_json) {
    body = json::parse(o.extra_json, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return bad("extra_json is not valid JSON");
    if (!body.is_object()) return bad("extra_json must be a JSON object");
  }
  if (chat) {
    if (!o.messages || o.num_messages == 0) return bad("messages is NULL or empty");
    json msgs = json::array();
    for (size_t i = 0; i < o.num_messages; ++i) {
      const ss_message& mm = o.messages[i];
      if (!mm.role || !mm.content) return bad("messages[" + std::to_string(i) + "] has a NULL role or content");
      msgs.push_back({{"role", mm.role}, {"content", mm.content}});
    }
    body["messages"] = std::move(msgs);
  } else {
    body["prompt"] = o.prompt;
  }
  body["model"] = e->info.id;
  body["max_tokens"] = o.max_tokens;
  if (o.min_tokens != 0) body["min_tokens"] = o.min_tokens;
  std::string why;
  if (!put_number(body, "temperature", o.temperature, &why) || !put_number(body, "top_p", o.top_p, &why) ||
      !put_number(body, "min_p", o.min_p, &why) || !put_number(body, "repetition_penalty", o.repetition_penalty, &why) ||
      !put_number(body, "presence_penalty", o.presence_penalty, &why) ||
      !put_number(body, "frequency_penalty", o.frequency_penalty, &why))
    return bad(why);
  body["top_k"] = o.top_k;
  if (o.seed >= 0) body["seed"] = o.seed;
  if (o.num_stop > 0) {
    if (!o.stop) return bad("stop is NULL with num_stop > 0");
    json stops = json::array();
    for (size_t i = 0; i < o.num_stop; ++i) {
      if (!o.stop[i]) return bad("stop[" + std::to_string(i) + "] is NULL");
      stops.push_back(o.stop[i]);
    }
    body["stop"] = std::move(stops);
  }
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (o.logprobs >= 0) {
    if (chat) {
      body["logprobs"] = true;
      body["top_logprobs"] = o.logprobs;
    } else {
      body["logprobs"] = o.logprobs;
    }
  }
  const int n_structured = (o.json_schema != nullptr) + (o.regex != nullptr) + (o.grammar != nullptr);
  if (n_structured > 1) return bad("give at most one of json_schema, regex and grammar");
  if (o.json_schema) {
    json schema = json::parse(o.json_schema, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return bad("json_schema is not valid JSON");
    body["guided_json"] = std::move(schema);
  }
  if (o.regex) body["guided_regex"] = o.regex;
  if (o.grammar) body["guided_grammar"] = o.grammar;
  if (o.timeout_s < 0 || !std::isfinite(o.timeout_s)) return bad("timeout_s must be >= 0");
  if (o.timeout_s > 0) body["timeout"] = o.timeout_s;

  const auto ep = chat ? ss::server::Endpoint::ChatCompletions : ss::server::Endpoint::Completions;
  auto parsed = ss::server::parse_generation_request(ep, body.dump(), e->info);
  if (!parsed.ok()) {
    const auto& err = parsed.error();
    const int32_t code = err.status >= 500 ? SS_ERR_INTERNAL : SS_ERR_INVALID_ARGUMENT;
    return fail(code, err.message, __FILE__, __LINE__);
  }
  const ss::server::GenerationRequest& g = parsed.value();
  uint64_t seed;
  {
    std::lock_guard<std::mutex> lk(e->seeder_mu);
    seed = e->seeder();
  }
  engine::Request r = ss::server::to_engine_request(g, 0, e->info, seed);
  if (g.timeout_s) r.deadline = engine::Clock::now() + std::chrono::duration_cast<engine::Clock::duration>(
                                                            std::chrono::duration<double>(*g.timeout_s));
  auto live = std::make_shared<Live>(*e->info.tokenizer, g);
  live->user_data = o.user_data;
  live->prompt_tokens = static_cast<int>(r.prompt.size());
  live->stop_ids = r.stop_ids;
  r.on_event = [e, live](const engine::TokenEvent& ev) { e->on_event(*live, ev); };
  // The id is ours, set before the engine sees the request: with the engine on its own thread its
  // first event can come before add_request returns.
  r.id = e->next_id.fetch_add(1, std::memory_order_relaxed);
  live->id = r.id;
  auto id = e->eng->add_request(std::move(r));
  if (!id.ok()) return fail_from(id.message(), SS_ERR_INVALID_ARGUMENT, __FILE__, __LINE__);
  *request_id = *id;
  e->notify();
  return SS_OK;
  SS_GUARD_END
}

extern "C" ss_status ss_engine_cancel(ss_engine* e, uint64_t request_id) {
  SS_GUARD_BEGIN
  if (!e) return fail(SS_ERR_INVALID_ARGUMENT, "engine is NULL", __FILE__, __LINE__);
  e->eng->abort(request_id);
  e->notify();
  return SS_OK;
  SS_GUARD_END
}

extern "C" void ss_engine_wake(ss_engine* e) {
  try {
    if (!e) return;
    e->notify();
    e->wake_poller();
  } catch (...) {
  }
}

// ---- events ----------------------------------------------------------------------------------

extern "C" ss_status ss_engine_poll(ss_engine* e, ss_event* events, size_t event_size, size_t capacity,
                                    size_t* count, int32_t timeout_ms) {
  SS_GUARD_BEGIN
  if (count) *count = 0;
  if (!e) return fail(SS_ERR_INVALID_ARGUMENT, "engine is NULL", __FILE__, __LINE__);
  if (!count) return fail(SS_ERR_INVALID_ARGUMENT, "count is NULL", __FILE__, __LINE__);
  if (capacity > 0 && !events) return fail(SS_ERR_INVALID_ARGUMENT, "events is NULL", __FILE__, __LINE__);
  if (event_size < offsetof(ss_event, stop_reason) + sizeof(const char*) && capacity > 0)
    return fail(SS_ERR_INVALID_ARGUMENT, "event_size is smaller than this ABI's first ss_event", __FILE__, __LINE__);
  e->polls.fetch_add(1, std::memory_order_relaxed);
  e->delivered.clear();  // the previous poll's strings end here
  using clock = std::chrono::steady_clock;
  const auto deadline = timeout_ms < 0 ? clock::time_point::max() : clock::now() + std::chrono::milliseconds(timeout_ms);
  auto queued = [&] {
    std::lock_guard<std::mutex> lk(e->qmu);
    return e->pending.size();
  };
  if (e->own_thread) {
    std::unique_lock<std::mutex> lk(e->qmu);
    const uint64_t seen = e->poll_wakes;
    auto ready = [&] { return !e->pending.empty() || !e->step_error.empty() || e->poll_wakes != seen; };
    if (capacity > 0) {
      if (timeout_ms < 0) e->qcv.wait(lk, ready);
      else e->qcv.wait_until(lk, deadline, ready);
      // Linger: let the engine's thread publish a few more steps (only a wake-up cuts it short).
      if (e->linger.count() > 0 && !e->pending.empty() && e->pending.size() < capacity) {
        const auto until = clock::now() + e->linger;
        // Ends early when nothing more can come (engine.mu is taken under qmu only here; the
        // stepping thread never holds it while it takes qmu).
        e->qcv.wait_until(lk, until, [&] {
          return e->poll_wakes != seen || e->pending.size() >= capacity || !e->eng->has_work();
        });
      }
    }
    if (!e->step_error.empty() && e->pending.empty()) {
      const std::string why = std::move(e->step_error);
      e->step_error.clear();
      return fail_from(why, SS_ERR_INTERNAL, __FILE__, __LINE__);
    }
  } else {
    bool stepped = false;
    clock::time_point linger_until = clock::time_point::max();
    for (;;) {
      if (capacity == 0) break;
      if (const size_t q = queued(); q > 0) {
        // Linger: go on stepping for a while, so this poll carries several steps' events.
        if (e->linger.count() == 0) break;
        if (linger_until == clock::time_point::max()) linger_until = clock::now() + e->linger;
        if (q >= capacity || clock::now() >= linger_until || !e->eng->has_work()) break;
        std::string why;
        if (!e->step_and_publish(&why)) return fail_from(why, SS_ERR_INTERNAL, __FILE__, __LINE__);
        continue;
      }
      uint64_t seen;  // read before has_work(): a submit after that check still wakes the wait below
      {
        std::lock_guard<std::mutex> lk(e->mu);
        seen = e->wakes;
      }
      if (e->eng->has_work()) {
        if (timeout_ms == 0 && stepped) break;
        stepped = true;
        std::string why;
        // A failed step finishes its requests with SS_FINISH_ERROR events; only a failure nobody
        // hears about is the caller's.
        if (!e->step_and_publish(&why)) return fail_from(why, SS_ERR_INTERNAL, __FILE__, __LINE__);
        if (clock::now() >= deadline) break;
        continue;
      }
      std::unique_lock<std::mutex> lk(e->mu);
      auto woken = [&] { return e->wakes != seen; };
      if (timeout_ms < 0) e->cv.wait(lk, woken);
      else if (!e->cv.wait_until(lk, deadline, woken)) break;
      lk.unlock();
      if (!e->eng->has_work()) break;  // ss_engine_wake without work: return what there is (nothing)
    }
  }
  {
    std::lock_guard<std::mutex> lk(e->qmu);
    const size_t n = std::min(capacity, e->pending.size());
    e->delivered.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      e->delivered.push_back(std::move(e->pending.front()));
      e->pending.pop_front();
    }
  }
  const size_t n = e->delivered.size();
  auto* base = reinterpret_cast<unsigned char*>(events);
  for (size_t i = 0; i < n; ++i) {
    const Pending& p = e->delivered[i];
    ss_event v{};
    v.request_id = p.id;
    v.user_data = p.user_data;
    v.token = p.token;
    v.finish = p.finish;
    v.text = p.text.c_str();
    v.text_len = p.text.size();
    v.has_logprob = p.has_logprob;
    v.logprob = p.logprob;
    v.top_logprobs = p.top.empty() ? nullptr : p.top.data();
    v.num_top_logprobs = static_cast<int32_t>(p.top.size());
    v.prompt_tokens = p.prompt_tokens;
    v.completion_tokens = p.completion_tokens;
    v.error_code = p.error_code;
    v.error_message = p.error_message.c_str();
    v.stop_reason = p.has_stop_reason ? p.stop_reason.c_str() : nullptr;
    // A caller with an older (smaller) ss_event gets the prefix it knows; a newer one the rest zeroed.
    unsigned char* dst = base + i * event_size;
    std::memcpy(dst, &v, std::min(sizeof(v), event_size));
    if (event_size > sizeof(v)) std::memset(dst + sizeof(v), 0, event_size - sizeof(v));
  }
  *count = n;
  e->events.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  return SS_OK;
  SS_GUARD_END
}

extern "C" int ss_engine_event_fd(const ss_engine* e) { return e ? e->event_fd : -1; }

// ---- metrics ---------------------------------------------------------------------------------

extern "C" ss_status ss_engine_metrics(const ss_engine* e, ss_metrics* out) {
  SS_GUARD_BEGIN
  if (!e) return fail(SS_ERR_INVALID_ARGUMENT, "engine is NULL", __FILE__, __LINE__);
  if (!struct_ok(out, "ss_metrics")) return ss::capi::last_status();
  const engine::EngineStats s = e->eng->stats();
  ss_metrics m{};
  m.struct_size = out->struct_size;
  m.num_running = s.num_running;
  m.num_waiting = s.num_waiting;
  m.kv_blocks_total = s.kv_blocks_total;
  m.kv_blocks_used = s.kv_blocks_used;
  m.kv_blocks_cached = s.kv_blocks_cached;
  m.kv_usage = s.kv_usage;
  m.prompt_tokens = s.prompt_tokens;
  m.generation_tokens = s.generation_tokens;
  m.finished_requests = s.finished_requests;
  m.preemptions = s.preemptions;
  m.steps = s.steps;
  m.decode_steps = s.decode_steps;
  m.decode_step_seconds = s.decode_step_seconds;
  m.decode_step_tokens = s.decode_step_tokens;
  m.prefix_hit_rate = s.prefix_hit_rate;
  m.polls = e->polls.load(std::memory_order_relaxed);
  m.events = e->events.load(std::memory_order_relaxed);
  std::memcpy(out, &m, std::min(sizeof(m), out->struct_size));
  return SS_OK;
  SS_GUARD_END
}

// Serving load generator: drives any OpenAI-compatible server over HTTP (POST /v1/completions,
// streaming) with a request mix like the field's, and reports throughput and TTFT/TPOT/e2e latency
// per load level. The CLI (`selfserve bench serve`) is a thin layer over run_bench().
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ss::bench {

// ---- statistics --------------------------------------------------------------------------------
// p in [0, 100]; linear interpolation between closest ranks (numpy's default). Empty input: 0.
double percentile(std::vector<double> values, double p);

// ---- SSE ---------------------------------------------------------------------------------------
// Incremental Server-Sent-Events parser: feed it bytes as they arrive (split anywhere, even inside
// a "\r\n"); it calls on_data once per complete event with that event's joined `data:` lines.
class SseParser {
 public:
  using Callback = std::function<void(std::string_view data)>;
  explicit SseParser(Callback on_data) : on_data_(std::move(on_data)) {}
  void feed(std::string_view bytes);
  void finish();  // end of stream: dispatches a last event that lacked its blank line

 private:
  void line(std::string_view l);
  Callback on_data_;
  std::string buf_;   // bytes of the current, incomplete line
  std::string data_;  // data lines of the current event
  bool have_data_ = false;
  bool skip_lf_ = false;  // last byte was '\r': a following '\n' belongs to it
};

// One parsed completion chunk (an SSE `data:` payload of /v1/completions or /v1/chat/completions).
struct ChunkInfo {
  bool done = false;             // "[DONE]"
  std::string text;              // choices[0].text or choices[0].delta.content
  std::optional<int64_t> completion_tokens, prompt_tokens;  // usage, when present
  std::optional<std::string> error;  // {"error": ...} in the stream, or unparseable JSON
};
ChunkInfo parse_chunk(std::string_view data);

// ---- request mix -------------------------------------------------------------------------------
struct MixConfig {
  double short_frac = 0.3, medium_frac = 0.5, long_frac = 0.2;  // normalised when sampling
  int short_max = 128, medium_max = 2048;  // short: [8, 128], medium: (128, 2048], long: (2048, ctx]
  int max_context = 8192;                  // prompt + output must fit
  int out_min = 16, out_max = 256;         // output tokens, uniform
  double tokens_per_word = 1.3;            // prompt-length estimate (calibrated by /tokenize if served)
};

enum class PromptClass { kShort, kMedium, kLong };
const char* class_name(PromptClass c);

struct RequestSpec {
  PromptClass klass = PromptClass::kShort;
  int prompt_tokens = 0;  // target (estimated) prompt length
  int max_tokens = 0;
  std::string prompt;
};

// Deterministic for a given seed: the same seed gives the same sequence of requests.
class MixSampler {
 public:
  MixSampler(MixConfig cfg, uint64_t seed);
  RequestSpec next();
  static std::string words(std::mt19937_64& rng, int n);  // n random words from the fixed list
  const MixConfig& config() const { return cfg_; }

 private:
  MixConfig cfg_;
  std::mt19937_64 rng_;
};

// ---- HTTP --------------------------------------------------------------------------------------
struct Url {
  std::string host, port, base_path;  // base_path without trailing '/'
};
Expected<Url> parse_url(const std::string& url);  // http:// only

struct ClientConfig {
  Url url;
  std::string api_key;  // sent as "Authorization: Bearer ..." when non-empty
  std::string model;
  double timeout_s = 300;  // whole request (connect to last byte)
  bool ignore_eos = true;  // ask for exactly max_tokens (vLLM/SGLang extension; others ignore it)
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body (--extra-body)
};

struct RequestResult {
  bool ok = false;
  int http_status = 0;
  std::string error;          // empty when ok
  double ttft_s = 0, e2e_s = 0;  // from the start of connect
  int64_t output_tokens = 0;  // usage.completion_tokens when reported, else text chunks
  int64_t prompt_tokens = 0;  // usage.prompt_tokens when reported, else the estimate
  int64_t chunks = 0;         // non-empty text chunks
  bool usage_reported = false;
  double start_s = 0;         // offset from the level's start
  double tpot_s() const;      // (e2e - ttft) / (output_tokens - 1); 0 when < 2 tokens
};

// Small blocking helpers (own io_context each): GET/POST returning {status, body}.
struct HttpReply {
  int status = 0;
  std::string body;
};
Expected<HttpReply> http_get(const ClientConfig& c, const std::string& path);
Expected<HttpReply> http_post_json(const ClientConfig& c, const std::string& path, const std::string& body);
// First entry of GET /v1/models.
Expected<std::string> default_model(const ClientConfig& c);
// Tokens per word of our word list measured with POST /tokenize (vLLM, selfserve), and the
// server's max_model_len when it says; nullopt when the server has no such endpoint.
struct TokenizeProbe {
  double tokens_per_word = 0;
  int64_t max_model_len = 0;  // 0: not reported
};
std::optional<TokenizeProbe> probe_tokenize(const ClientConfig& c, uint64_t seed);

// Draws the PNG with tools/plot_bench.py (matplotlib) from a JSON report.
Status plot_report(const std::string& json_path, const std::string& png_path);

// ---- load levels -------------------------------------------------------------------------------
struct LevelConfig {
  int concurrency = 0;    // > 0: closed loop with this many clients
  double rate = 0;        // > 0: open loop, Poisson arrivals at this many req/s
  int num_requests = 100; // at most this many requests are started
  double duration_s = 60; // and none after this many seconds; in-flight ones finish (or time out)
  uint64_t seed = 0;      // Poisson arrival times
};

struct LevelReport {
  LevelConfig level;
  double wall_s = 0;
  int ok = 0, errors = 0;
  std::map<std::string, int> error_kinds;  // e.g. "http 429", "timeout"
  double req_per_s = 0, out_tok_per_s = 0, in_tok_per_s = 0;
  int64_t output_tokens = 0, prompt_tokens = 0;
  struct Pct {
    double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  } ttft, tpot, e2e;  // seconds, over successful requests
  std::vector<RequestResult> requests;
};

// Summarise finished requests (pure; used by run_level and the tests).
LevelReport summarize(const LevelConfig& level, std::vector<RequestResult> results, double wall_s);

// Runs one level against the server; the sampler supplies the requests.
LevelReport run_level(const ClientConfig& c, const LevelConfig& level, MixSampler& sampler);

nlohmann::json to_json(const LevelReport& r, bool with_requests = false);

// ---- multi-turn: conversations that come back after an idle gap ----------------------------------
// Each conversation sends a long history (turn 1), waits `idle_s` (set it longer than the server's
// KV TTL), then sends its returning turn (history + a short new message) twice, in alternating
// order: once with the conversation's cache_salt (the server may reuse the history: from its pool
// or a KV tier) and once with a fresh salt (the history must be recomputed). TTFT of both is the
// comparison; sending them one after the other on the same server interleaves the noise.
struct MultiTurnConfig {
  int conversations = 6;
  int history_tokens = 4000;  // estimated from tokens_per_word
  int message_tokens = 16;    // the returning turn's new message
  int answer_tokens = 8;
  double idle_s = 3;
  uint64_t seed = 0;
  double tokens_per_word = 1.3;
};
struct MultiTurnReport {
  std::vector<double> warm_ttft_s, cold_ttft_s;  // the returning turn: same salt / fresh salt
  std::vector<int64_t> prompt_tokens;            // of each returning turn (usage)
  std::map<std::string, int> errors;
};
MultiTurnReport run_multi_turn(const ClientConfig& c, const MultiTurnConfig& m,
                               const std::function<void(const std::string&)>& progress = {});
// One streaming completion, blocking (extra: fields merged into the body, e.g. cache_salt).
RequestResult complete_once(const ClientConfig& c, const std::string& prompt, int max_tokens,
                            const nlohmann::json& extra = nlohmann::json::object());
// The stdout table: one header (when header) and one row per level.
std::string table_header();
std::string table_row(const LevelReport& r);

}  // namespace ss::bench

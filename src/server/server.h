// The server folder's public header: an OpenAI-compatible HTTP server over the engine.
// One event-loop thread (Boost.Asio io_context, C++20 coroutines, Boost.Beast HTTP) holds every
// connection; the engine runs on its own thread and hands tokens back through per-request
// mailboxes that wake the connection's coroutine. Request parsing and tokenization run on a small
// worker pool so a large body never stalls the event loop.
//
// The HTTP edge (RFC 9112): framing is checked on the headers (a Transfer-Encoding that is not a
// single final `chunked`, one together with Content-Length, a missing or repeated Host: 400 and the
// connection closed), then the API key, before any body byte is read (401, closed); connections and
// buffered body bytes are capped (503 + Retry-After). docs/server.md lists the rules.
//
// Lifecycle: create() binds the port; run() serves (from then on /health answers 503 "loading")
// until shutdown() or SIGTERM/SIGINT; set_ready() turns the API on once the model is warm. On
// shutdown new requests get 503, in-flight ones finish or are cancelled after shutdown_timeout_s,
// then run() returns. The engine given to set_ready must be stopped and destroyed before the
// Server (its callbacks post into the server's event loop).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "engine/engine.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "telemetry/telemetry.h"

namespace ss::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                      // 0: any free port (see Server::port())
  std::string api_key;                  // empty: no authentication
  size_t max_body_bytes = 4u << 20;     // larger bodies get 413
  int max_waiting = 256;                // queued choices beyond the running seats; more get 429
  int max_num_seqs = 64;                // the engine's running seats (for the waiting estimate)
  double request_timeout_s = 600;       // default deadline per request; 0: none
  double shutdown_timeout_s = 30;       // drain time before in-flight requests are cancelled
  double watchdog_s = 60;               // /health turns 503 when the engine has work but no step
                                        // finished for this long
  double idle_timeout_s = 120;          // keep-alive connections idle this long are closed; also the
                                        // limit for reading one request's body
  double header_timeout_s = 10;         // a request's headers must be complete this long after its
                                        // first byte (a new connection's first request: after accept)
  int max_connections = 1024;           // open connections; one more gets 503 + Retry-After, closed
  size_t max_buffered_body_bytes = 256u << 20;  // request bodies held across all connections; a body
                                                // that would pass it gets 503 + Retry-After, closed
  bool metrics_require_key = false;     // with api_key: /metrics needs the key too (/health never)
  bool handle_signals = true;           // SIGTERM / SIGINT start a graceful shutdown
  bool log_requests = false;            // one line per request on stderr, as it arrives
  bool access_log = true;               // one line per answered request (telemetry::Logger)
  bool log_prompts = false;             // the access line of a generation carries its prompt text
  // Traces: one span tree per generation request, sampled at otlp_sample_ratio (a caller's
  // traceparent decides for its trace); exported on the exporter's thread. Null: no spans (the
  // trace id is still continued or made, returned and logged).
  std::shared_ptr<telemetry::OtlpExporter> tracer;
  double otlp_sample_ratio = 1.0;
};

class Server {
 public:
  static Expected<std::unique_ptr<Server>> create(const ServerOptions& opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;  // the bound port
  // Thread-safe. The engine must be running (Engine::start) and outlive run().
  // Labels of the info gauge selfserve_memory_mode_info (--memory-mode and what it set); call
  // before set_ready (the series appears with it).
  void set_memory_mode_info(std::map<std::string, std::string> labels);
  void set_ready(engine::Engine& engine, const ModelInfo& model);
  // The same with a router (engine.h): new requests go to its fallback engine while the primary is
  // at memory pressure level 3. The router and both engines outlive run().
  void set_ready(engine::EngineRouter& router, const ModelInfo& model);
  // Serves on the calling thread until the shutdown completes.
  Status run();
  // Thread-safe; same as SIGTERM (a second call cancels in-flight requests at once).
  void shutdown();
  bool shutting_down() const;

  MetricsRegistry& metrics();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ss::server

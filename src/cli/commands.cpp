#include "cli/commands.h"

#include <cstdio>

#include "telemetry/telemetry.h"

namespace ss::cli {

namespace {
int g_exit_code = 0;
}

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }
void fail(const std::string& message) {
  if (telemetry::Logger::global().format() == telemetry::LogFormat::Json) telemetry::log_error("cli", message);
  else std::fprintf(stderr, "selfserve: %s\n", message.c_str());
  g_exit_code = 1;
}

void register_commands(CLI::App& app) {
  register_generate(app);
  register_tokenize(app);
  register_inspect(app);
  register_fetch(app);
  register_bench(app);
  register_serve(app);
  register_synth(app);
  register_topology(app);
}

}  // namespace ss::cli

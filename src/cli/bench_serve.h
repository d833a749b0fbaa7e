// `selfserve bench serve`: the HTTP load generator (src/bench/), registered under `bench`.
#pragma once
#include <CLI/CLI.hpp>

namespace ss::cli {
void register_bench_serve(CLI::App& bench);
}  // namespace ss::cli

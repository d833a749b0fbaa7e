// Subcommand registration: each command file adds its options and callback to the app.
#pragma once
#include <CLI/CLI.hpp>

namespace ss::cli {

void register_commands(CLI::App& app);
void register_generate(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_inspect(CLI::App& app);
void register_fetch(CLI::App& app);
void register_bench(CLI::App& app);
void register_serve(CLI::App& app);
void register_synth(CLI::App& app);
void register_topology(CLI::App& app);

// Commands record their result here; main returns it.
void set_exit_code(int code);
int exit_code();
// Prints "selfserve: <message>" on stderr and sets exit code 1.
void fail(const std::string& message);

}  // namespace ss::cli

// selfserve: the command-line entry point. Each subcommand is a thin layer over the libraries.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"selfserve — an LLM inference server whose GPU schedules its own work"};
  app.set_version_flag("--version", std::string("selfserve ") + SELFSERVE_VERSION);
  app.require_subcommand(1);
  ss::cli::register_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return ss::cli::exit_code();
}

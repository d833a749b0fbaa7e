// selfserve topology: the machine (CPU, NUMA, caches, RAM, huge pages, GPUs, copy bandwidths), cached
// in $SELFSERVE_HOME/topology.json and measured again when the hardware fingerprint changes.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/default_model.h"
#include "topology/topology.h"

namespace ss::cli {

void register_topology(CLI::App& app) {
  struct Args {
    bool json = false;
    bool remeasure = false;
  };
  auto a = std::make_shared<Args>();
  auto* c = app.add_subcommand("topology", "CPU, NUMA, caches, RAM, huge pages, GPUs and measured copy bandwidths");
  c->add_flag("--json", a->json, "One JSON object (src/topology/topology.schema.json)");
  c->add_flag("--remeasure", a->remeasure, "Measure again even when the cached topology matches");
  c->callback([a] {
    const std::string cache = selfserve_home() + "/topology.json";
    const topology::Loaded r = topology::load_or_measure(cache, a->remeasure);
    if (r.from_cache) std::fprintf(stderr, "selfserve: topology from the cache %s\n", cache.c_str());
    else std::fprintf(stderr, "selfserve: topology measured (%s); cached in %s\n", r.why.c_str(), cache.c_str());
    if (a->json) std::printf("%s\n", topology::to_json(r.topology).dump(2).c_str());
    else std::fputs(topology::to_text(r.topology).c_str(), stdout);
  });
}

}  // namespace ss::cli

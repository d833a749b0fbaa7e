// The machine selfserve runs on: CPU (model, cores, SMT, NUMA nodes, caches), RAM and huge pages
// from /proc and /sys; GPUs (name, memory, SMs, PCIe link, peer access) through the CUDA driver
// (libcuda.so.1, loaded at run time: none here means an empty list and a note); measured copy
// bandwidths (host memcpy; H2D/D2H pinned and pageable, D2D with a GPU). Measuring takes a second,
// so the result is cached as JSON in $SELFSERVE_HOME/topology.json with a fingerprint of the
// hardware and driver, and measured again when the fingerprint no longer matches. The JSON's shape
// is src/topology/topology.schema.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ss::topology {

struct CacheLevel {
  int level = 0;
  std::string type;          // Data, Instruction, Unified
  int64_t size_bytes = 0;
  int instances = 0;         // distinct caches of this level and type
};

struct NumaNode {
  int id = 0;
  std::string cpus;          // the kernel's list, e.g. "0-15,32-47"
  int64_t memory_bytes = 0;
};

struct Gpu {
  int index = 0;
  std::string name;
  int64_t memory_bytes = 0;
  int sms = 0;
  int compute_major = 0, compute_minor = 0;
  std::string pci_bus_id;
  std::string pcie_link_speed;  // from sysfs, e.g. "32.0 GT/s PCIe"; empty when unknown
  int pcie_link_width = 0;
  std::vector<int> peers;       // devices this one can access directly (P2P / NVLink)
  double h2d_pinned_gbps = 0, d2h_pinned_gbps = 0, h2d_pageable_gbps = 0, d2h_pageable_gbps = 0, d2d_gbps = 0;
};

struct Topology {
  std::string cpu_model;
  int logical_cpus = 0;     // online CPUs
  int usable_cpus = 0;      // of those, in this process's affinity mask
  int physical_cores = 0;
  int sockets = 0;
  int threads_per_core = 0;
  std::vector<CacheLevel> caches;
  std::vector<NumaNode> numa_nodes;
  int64_t ram_bytes = 0;
  int64_t hugepage_bytes = 0;      // default huge page size
  int64_t hugepages_total = 0, hugepages_free = 0;
  std::string transparent_hugepages;  // the selected mode: always, madvise, never
  int cuda_driver_version = 0;        // 0: no driver
  std::vector<Gpu> gpus;
  std::string gpu_note;               // why the list is empty, when it is
  double host_memcpy_gbps = 0;        // measured (0: not measured)
  std::string fingerprint;            // of the hardware and driver (hardware_fingerprint)
  std::string measured_at;            // UTC, ISO 8601
};

// Reads the static facts (no measurement; cheap) and fills the fingerprint.
Topology probe();
// Measures the bandwidths into t (host memcpy; per GPU H2D/D2H/D2D).
void measure(Topology& t);
// A hex digest of what identifies the machine: CPU model and counts, NUMA nodes, RAM (GiB), kernel
// release, GPUs (name, memory, bus id) and the driver version.
std::string hardware_fingerprint(const Topology& t);

nlohmann::json to_json(const Topology& t);
Expected<Topology> from_json(const nlohmann::json& j);
std::string to_text(const Topology& t);

// The cached topology when its fingerprint matches this machine's, else a fresh measurement
// written to `cache_path` (empty: no cache). `why`: "cache", or why it was measured.
struct Loaded {
  Topology topology;
  bool from_cache = false;
  std::string why;
};
Loaded load_or_measure(const std::string& cache_path, bool force_measure = false);

// The forward pass's default thread count: one per physical core this process may run on (SMT
// siblings share a core's vector units, which the matmuls saturate).
int default_threads(const Topology& t);

}  // namespace ss::topology

#include "topology/topology.h"

#include <dlfcn.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>


namespace ss::topology {

namespace fs = std::filesystem;

namespace {

std::string read_line(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  if (f) std::getline(f, s);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

int64_t read_int(const fs::path& p, int64_t dflt = -1) {
  const std::string s = read_line(p);
  if (s.empty()) return dflt;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  return end == s.c_str() ? dflt : v;
}

// "491520K" / "48K" / "2M" as sysfs writes cache sizes.
int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str()) return 0;
  switch (*end) {
    case 'K': return v * 1024;
    case 'M': return v * 1024 * 1024;
    case 'G': return v * 1024LL * 1024 * 1024;
    default: return v;
  }
}

// "0-3,8,10-11" -> the CPU ids.
std::vector<int> parse_cpu_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    int a = 0, b = 0;
    if (std::sscanf(part.c_str(), "%d-%d", &a, &b) == 2) {
      for (int i = a; i <= b; ++i) out.push_back(i);
    } else if (std::sscanf(part.c_str(), "%d", &a) == 1) {
      out.push_back(a);
    }
  }
  return out;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void probe_cpu(Topology& t) {
  {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("model name", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) t.cpu_model = line.substr(colon + 2);
        break;
      }
  }
  const fs::path cpu_root = "/sys/devices/system/cpu";
  std::vector<int> online = parse_cpu_list(read_line(cpu_root / "online"));
  if (online.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < n; ++i) online.push_back(static_cast<int>(i));
  }
  t.logical_cpus = static_cast<int>(online.size());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const bool have_mask = sched_getaffinity(0, sizeof mask, &mask) == 0;
  std::set<std::pair<int64_t, int64_t>> cores;
  std::set<int64_t> packages;
  int usable = 0;
  for (int c : online) {
    const fs::path topo = cpu_root / ("cpu" + std::to_string(c)) / "topology";
    const int64_t pkg = read_int(topo / "physical_package_id", 0);
    const int64_t core = read_int(topo / "core_id", c);
    cores.insert({pkg, core});
    packages.insert(pkg);
    if (!have_mask || CPU_ISSET(c, &mask)) ++usable;
  }
  t.usable_cpus = usable;
  t.physical_cores = std::max<int>(1, static_cast<int>(cores.size()));
  t.sockets = std::max<int>(1, static_cast<int>(packages.size()));
  t.threads_per_core = std::max(1, t.logical_cpus / t.physical_cores);
  // Caches: every (level, type) with its size and the number of distinct instances (by shared CPU list).
  std::map<std::pair<int, std::string>, std::pair<int64_t, std::set<std::string>>> caches;
  for (int c : online) {
    const fs::path dir = cpu_root / ("cpu" + std::to_string(c)) / "cache";
    for (int i = 0; i < 16; ++i) {
      const fs::path idx = dir / ("index" + std::to_string(i));
      if (!fs::exists(idx)) break;
      const int level = static_cast<int>(read_int(idx / "level", 0));
      const std::string type = read_line(idx / "type");
      auto& e = caches[{level, type}];
      e.first = parse_size(read_line(idx / "size"));
      e.second.insert(read_line(idx / "shared_cpu_list"));
    }
  }
  for (const auto& [k, v] : caches) t.caches.push_back({k.first, k.second, v.first, static_cast<int>(v.second.size())});
  // NUMA nodes.
  const fs::path node_root = "/sys/devices/system/node";
  for (int id : parse_cpu_list(read_line(node_root / "online"))) {
    NumaNode n;
    n.id = id;
    const fs::path nd = node_root / ("node" + std::to_string(id));
    n.cpus = read_line(nd / "cpulist");
    std::ifstream f(nd / "meminfo");
    std::string line;
    while (std::getline(f, line)) {
      long long kb = 0;
      int nid = 0;
      if (std::sscanf(line.c_str(), "Node %d MemTotal: %lld kB", &nid, &kb) == 2) n.memory_bytes = kb * 1024;
    }
    t.numa_nodes.push_back(n);
  }
}

void probe_memory(Topology& t) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    long long v = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %lld kB", &v) == 1) t.ram_bytes = v * 1024;
    else if (std::sscanf(line.c_str(), "Hugepagesize: %lld kB", &v) == 1) t.hugepage_bytes = v * 1024;
    else if (std::sscanf(line.c_str(), "HugePages_Total: %lld", &v) == 1) t.hugepages_total = v;
    else if (std::sscanf(line.c_str(), "HugePages_Free: %lld", &v) == 1) t.hugepages_free = v;
  }
  const std::string thp = read_line("/sys/kernel/mm/transparent_hugepage/enabled");  // "always [madvise] never"
  const auto a = thp.find('['), b = thp.find(']');
  t.transparent_hugepages = a != std::string::npos && b != std::string::npos && b > a ? thp.substr(a + 1, b - a - 1) : "";
}

// The CUDA driver API, loaded by name: nothing here links against CUDA.
struct Driver {
  void* h = nullptr;
  int (*cuInit)(unsigned) = nullptr;
  int (*cuDriverGetVersion)(int*) = nullptr;
  int (*cuDeviceGetCount)(int*) = nullptr;
  int (*cuDeviceGet)(int*, int) = nullptr;
  int (*cuDeviceGetName)(char*, int, int) = nullptr;
  int (*cuDeviceTotalMem)(size_t*, int) = nullptr;
  int (*cuDeviceGetAttribute)(int*, int, int) = nullptr;
  int (*cuDeviceGetPCIBusId)(char*, int, int) = nullptr;
  int (*cuDeviceCanAccessPeer)(int*, int, int) = nullptr;
  int (*cuDevicePrimaryCtxRetain)(void**, int) = nullptr;
  int (*cuDevicePrimaryCtxRelease)(int) = nullptr;
  int (*cuCtxSetCurrent)(void*) = nullptr;
  int (*cuCtxSynchronize)() = nullptr;
  int (*cuMemAlloc)(unsigned long long*, size_t) = nullptr;
  int (*cuMemFree)(unsigned long long) = nullptr;
  int (*cuMemAllocHost)(void**, size_t) = nullptr;
  int (*cuMemFreeHost)(void*) = nullptr;
  int (*cuMemcpyHtoD)(unsigned long long, const void*, size_t) = nullptr;
  int (*cuMemcpyDtoH)(void*, unsigned long long, size_t) = nullptr;
  int (*cuMemcpyDtoD)(unsigned long long, unsigned long long, size_t) = nullptr;

  template <class F>
  bool sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(h, name));
    return f != nullptr;
  }
  bool load(std::string* why) {
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      *why = "no NVIDIA driver (libcuda.so.1 not found)";
      return false;
    }
    const bool ok = sym(cuInit, "cuInit") && sym(cuDriverGetVersion, "cuDriverGetVersion") &&
                    sym(cuDeviceGetCount, "cuDeviceGetCount") && sym(cuDeviceGet, "cuDeviceGet") &&
                    sym(cuDeviceGetName, "cuDeviceGetName") && sym(cuDeviceTotalMem, "cuDeviceTotalMem_v2") &&
                    sym(cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
                    sym(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId") &&
                    sym(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer") &&
                    sym(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
                    sym(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") &&
                    sym(cuCtxSetCurrent, "cuCtxSetCurrent") && sym(cuCtxSynchronize, "cuCtxSynchronize") &&
                    sym(cuMemAlloc, "cuMemAlloc_v2") && sym(cuMemFree, "cuMemFree_v2") &&
                    sym(cuMemAllocHost, "cuMemAllocHost_v2") && sym(cuMemFreeHost, "cuMemFreeHost") &&
                    sym(cuMemcpyHtoD, "cuMemcpyHtoD_v2") && sym(cuMemcpyDtoH, "cuMemcpyDtoH_v2") &&
                    sym(cuMemcpyDtoD, "cuMemcpyDtoD_v2");
    if (!ok) {
      *why = "libcuda.so.1 lacks the driver API entry points used here";
      return false;
    }
    if (cuInit(0) != 0) {
      *why = "the NVIDIA driver did not initialize (cuInit failed)";
      return false;
    }
    return true;
  }
};

Driver* driver(std::string* why) {
  static std::string reason;
  static Driver* d = [] {
    auto* p = new Driver;
    if (!p->load(&reason)) return static_cast<Driver*>(nullptr);
    return p;
  }();
  if (!d && why) *why = reason;
  return d;
}

// CUDA attribute numbers (cuda.h's CUdevice_attribute).
constexpr int kAttrSmCount = 16, kAttrCcMajor = 75, kAttrCcMinor = 76;

void probe_gpus(Topology& t) {
  std::string why;
  Driver* d = driver(&why);
  if (!d) {
    t.gpu_note = why;
    return;
  }
  (void)d->cuDriverGetVersion(&t.cuda_driver_version);
  int n = 0;
  if (d->cuDeviceGetCount(&n) != 0 || n == 0) {
    t.gpu_note = "the NVIDIA driver reports no GPU";
    return;
  }
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    if (d->cuDeviceGet(&dev, i) != 0) continue;
    Gpu g;
    g.index = i;
    char name[256] = {};
    if (d->cuDeviceGetName(name, sizeof name, dev) == 0) g.name = name;
    size_t mem = 0;
    if (d->cuDeviceTotalMem(&mem, dev) == 0) g.memory_bytes = static_cast<int64_t>(mem);
    (void)d->cuDeviceGetAttribute(&g.sms, kAttrSmCount, dev);
    (void)d->cuDeviceGetAttribute(&g.compute_major, kAttrCcMajor, dev);
    (void)d->cuDeviceGetAttribute(&g.compute_minor, kAttrCcMinor, dev);
    char bus[64] = {};
    if (d->cuDeviceGetPCIBusId(bus, sizeof bus, dev) == 0) {
      g.pci_bus_id = bus;
      std::string lower = bus;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const fs::path sys = fs::path("/sys/bus/pci/devices") / lower;
      g.pcie_link_speed = read_line(sys / "current_link_speed");
      g.pcie_link_width = static_cast<int>(read_int(sys / "current_link_width", 0));
    }
    for (int j = 0; j < n; ++j) {
      int other = 0, can = 0;
      if (j != i && d->cuDeviceGet(&other, j) == 0 && d->cuDeviceCanAccessPeer(&can, dev, other) == 0 && can)
        g.peers.push_back(j);
    }
    t.gpus.push_back(g);
  }
}

template <class F>
double best_gbps(size_t bytes, int reps, const F& copy) {
  copy();  // warm: first-touch page faults and lazy driver setup are not bandwidth
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    copy();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, double(bytes) / s / 1e9);
  }
  return best;
}

void measure_gpu(Driver& d, Gpu& g) {
  int dev = 0;
  void* ctx = nullptr;
  if (d.cuDeviceGet(&dev, g.index) != 0 || d.cuDevicePrimaryCtxRetain(&ctx, dev) != 0) return;
  d.cuCtxSetCurrent(ctx);
  constexpr size_t kBytes = 256u << 20;
  unsigned long long a = 0, b = 0;
  void* pinned = nullptr;
  std::vector<uint8_t> pageable(kBytes, 1);
  if (d.cuMemAlloc(&a, kBytes) == 0 && d.cuMemAlloc(&b, kBytes) == 0 && d.cuMemAllocHost(&pinned, kBytes) == 0) {
    std::memset(pinned, 1, kBytes);
    g.h2d_pinned_gbps = best_gbps(kBytes, 5, [&] { d.cuMemcpyHtoD(a, pinned, kBytes); });
    g.d2h_pinned_gbps = best_gbps(kBytes, 5, [&] { d.cuMemcpyDtoH(pinned, a, kBytes); });
    g.h2d_pageable_gbps = best_gbps(kBytes, 3, [&] { d.cuMemcpyHtoD(a, pageable.data(), kBytes); });
    g.d2h_pageable_gbps = best_gbps(kBytes, 3, [&] { d.cuMemcpyDtoH(pageable.data(), a, kBytes); });
    // A device copy reads and writes: count both, as bandwidth tools do.
    g.d2d_gbps = 2 * best_gbps(kBytes, 5, [&] {
      d.cuMemcpyDtoD(b, a, kBytes);
      d.cuCtxSynchronize();
    });
  }
  if (pinned) d.cuMemFreeHost(pinned);
  if (a) d.cuMemFree(a);
  if (b) d.cuMemFree(b);
  d.cuDevicePrimaryCtxRelease(dev);
}

}  // namespace

std::string hardware_fingerprint(const Topology& t) {
  std::ostringstream s;
  utsname u{};
  uname(&u);
  s << "cpu=" << t.cpu_model << ";logical=" << t.logical_cpus << ";cores=" << t.physical_cores
    << ";sockets=" << t.sockets << ";numa=" << t.numa_nodes.size() << ";ram_gib=" << (t.ram_bytes >> 30)
    << ";kernel=" << u.release << ";driver=" << t.cuda_driver_version;
  for (const Gpu& g : t.gpus) s << ";gpu=" << g.name << "," << g.memory_bytes << "," << g.pci_bus_id;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64: stable across builds and machines
  for (unsigned char c : s.str()) h = (h ^ c) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

Topology probe() {
  Topology t;
  probe_cpu(t);
  probe_memory(t);
  probe_gpus(t);
  t.fingerprint = hardware_fingerprint(t);
  return t;
}

void measure(Topology& t) {
  // Host memcpy: 64 MiB, well past the caches, best of 5.
  constexpr size_t kBytes = 64u << 20;
  std::vector<uint8_t> src(kBytes, 1), dst(kBytes, 0);
  t.host_memcpy_gbps = best_gbps(kBytes, 5, [&] {
    std::memcpy(dst.data(), src.data(), kBytes);
    asm volatile("" : : "r"(dst.data()) : "memory");  // the copy is used
  });
  if (Driver* d = driver(nullptr))
    for (Gpu& g : t.gpus) measure_gpu(*d, g);
  t.measured_at = utc_now();
}

nlohmann::json to_json(const Topology& t) {
  using J = nlohmann::json;
  J caches = J::array(), nodes = J::array(), gpus = J::array();
  for (const auto& c : t.caches)
    caches.push_back({{"level", c.level}, {"type", c.type}, {"size_bytes", c.size_bytes}, {"instances", c.instances}});
  for (const auto& n : t.numa_nodes) nodes.push_back({{"id", n.id}, {"cpus", n.cpus}, {"memory_bytes", n.memory_bytes}});
  for (const auto& g : t.gpus)
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"memory_bytes", g.memory_bytes},
                    {"sms", g.sms},
                    {"compute_capability", std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor)},
                    {"pci_bus_id", g.pci_bus_id},
                    {"pcie_link_speed", g.pcie_link_speed},
                    {"pcie_link_width", g.pcie_link_width},
                    {"peers", g.peers},
                    {"bandwidth_gbps",
                     {{"h2d_pinned", g.h2d_pinned_gbps},
                      {"d2h_pinned", g.d2h_pinned_gbps},
                      {"h2d_pageable", g.h2d_pageable_gbps},
                      {"d2h_pageable", g.d2h_pageable_gbps},
                      {"d2d", g.d2d_gbps}}}});
  return J{{"schema_version", 1},
           {"fingerprint", t.fingerprint},
           {"measured_at", t.measured_at},
           {"cpu",
            {{"model", t.cpu_model},
             {"logical_cpus", t.logical_cpus},
             {"usable_cpus", t.usable_cpus},
             {"physical_cores", t.physical_cores},
             {"sockets", t.sockets},
             {"threads_per_core", t.threads_per_core},
             {"caches", caches}}},
           {"numa_nodes", nodes},
           {"memory",
            {{"ram_bytes", t.ram_bytes},
             {"hugepage_bytes", t.hugepage_bytes},
             {"hugepages_total", t.hugepages_total},
             {"hugepages_free", t.hugepages_free},
             {"transparent_hugepages", t.transparent_hugepages}}},
           {"cuda_driver_version", t.cuda_driver_version},
           {"gpus", gpus},
           {"gpu_note", t.gpu_note},
           {"bandwidth_gbps", {{"host_memcpy", t.host_memcpy_gbps}}}};
}

Expected<Topology> from_json(const nlohmann::json& j) {
  try {
    if (j.at("schema_version").get<int>() != 1) return make_error("topology cache: unknown schema_version");
    Topology t;
    t.fingerprint = j.at("fingerprint").get<std::string>();
    t.measured_at = j.at("measured_at").get<std::string>();
    const auto& c = j.at("cpu");
    t.cpu_model = c.at("model").get<std::string>();
    t.logical_cpus = c.at("logical_cpus").get<int>();
    t.usable_cpus = c.at("usable_cpus").get<int>();
    t.physical_cores = c.at("physical_cores").get<int>();
    t.sockets = c.at("sockets").get<int>();
    t.threads_per_core = c.at("threads_per_core").get<int>();
    for (const auto& x : c.at("caches"))
      t.caches.push_back({x.at("level").get<int>(), x.at("type").get<std::string>(), x.at("size_bytes").get<int64_t>(),
                          x.at("instances").get<int>()});
    for (const auto& x : j.at("numa_nodes"))
      t.numa_nodes.push_back({x.at("id").get<int>(), x.at("cpus").get<std::string>(), x.at("memory_bytes").get<int64_t>()});
    const auto& m = j.at("memory");
    t.ram_bytes = m.at("ram_bytes").get<int64_t>();
    t.hugepage_bytes = m.at("hugepage_bytes").get<int64_t>();
    t.hugepages_total = m.at("hugepages_total").get<int64_t>();
    t.hugepages_free = m.at("hugepages_free").get<int64_t>();
    t.transparent_hugepages = m.at("transparent_hugepages").get<std::string>();
    t.cuda_driver_version = j.at("cuda_driver_version").get<int>();
    for (const auto& x : j.at("gpus")) {
      Gpu g;
      g.index = x.at("index").get<int>();
      g.name = x.at("name").get<std::string>();
      g.memory_bytes = x.at("memory_bytes").get<int64_t>();
      g.sms = x.at("sms").get<int>();
      const std::string cc = x.at("compute_capability").get<std::string>();
      std::sscanf(cc.c_str(), "%d.%d", &g.compute_major, &g.compute_minor);
      g.pci_bus_id = x.at("pci_bus_id").get<std::string>();
      g.pcie_link_speed = x.at("pcie_link_speed").get<std::string>();
      g.pcie_link_width = x.at("pcie_link_width").get<int>();
      g.peers = x.at("peers").get<std::vector<int>>();
      const auto& b = x.at("bandwidth_gbps");
      g.h2d_pinned_gbps = b.at("h2d_pinned").get<double>();
      g.d2h_pinned_gbps = b.at("d2h_pinned").get<double>();
      g.h2d_pageable_gbps = b.at("h2d_pageable").get<double>();
      g.d2h_pageable_gbps = b.at("d2h_pageable").get<double>();
      g.d2d_gbps = b.at("d2d").get<double>();
      t.gpus.push_back(g);
    }
    t.gpu_note = j.at("gpu_note").get<std::string>();
    t.host_memcpy_gbps = j.at("bandwidth_gbps").at("host_memcpy").get<double>();
    return t;
  } catch (const std::exception& e) {
    return make_error(std::string("topology cache: ") + e.what());
  }
}

std::string to_text(const Topology& t) {
  std::ostringstream o;
  char buf[256];
  o << "CPU      " << t.cpu_model << "\n";
  std::snprintf(buf, sizeof buf, "         %d logical CPUs (%d usable here), %d physical cores, %d socket(s), %d thread(s)/core\n",
                t.logical_cpus, t.usable_cpus, t.physical_cores, t.sockets, t.threads_per_core);
  o << buf;
  for (const auto& c : t.caches) {
    std::snprintf(buf, sizeof buf, "         L%d %-11s %8lld KiB x %d\n", c.level, c.type.c_str(),
                  static_cast<long long>(c.size_bytes >> 10), c.instances);
    o << buf;
  }
  o << "NUMA     " << t.numa_nodes.size() << " node(s)";
  for (const auto& n : t.numa_nodes) o << "; node " << n.id << ": CPUs " << n.cpus << ", " << (n.memory_bytes >> 20) << " MiB";
  o << "\n";
  std::snprintf(buf, sizeof buf, "RAM      %.1f GiB; huge pages %lld x %lld KiB (%lld free); THP %s\n",
                double(t.ram_bytes) / double(1LL << 30), static_cast<long long>(t.hugepages_total),
                static_cast<long long>(t.hugepage_bytes >> 10), static_cast<long long>(t.hugepages_free),
                t.transparent_hugepages.empty() ? "unknown" : t.transparent_hugepages.c_str());
  o << buf;
  if (t.gpus.empty()) {
    o << "GPUs     none: " << t.gpu_note << "\n";
  } else {
    o << "GPUs     " << t.gpus.size() << " (CUDA driver " << t.cuda_driver_version / 1000 << "."
      << (t.cuda_driver_version % 1000) / 10 << ")\n";
    for (const auto& g : t.gpus) {
      std::snprintf(buf, sizeof buf, "         [%d] %s, %lld MiB, %d SMs, compute %d.%d, PCIe %s x%d (%s)", g.index,
                    g.name.c_str(), static_cast<long long>(g.memory_bytes >> 20), g.sms, g.compute_major,
                    g.compute_minor, g.pcie_link_speed.empty() ? "?" : g.pcie_link_speed.c_str(), g.pcie_link_width,
                    g.pci_bus_id.c_str());
      o << buf << "; peers:";
      if (g.peers.empty()) o << " none";
      for (int p : g.peers) o << " " << p;
      std::snprintf(buf, sizeof buf,
                    "\n         H2D %.1f GB/s pinned, %.1f pageable; D2H %.1f pinned, %.1f pageable; D2D %.1f GB/s\n",
                    g.h2d_pinned_gbps, g.h2d_pageable_gbps, g.d2h_pinned_gbps, g.d2h_pageable_gbps, g.d2d_gbps);
      o << buf;
    }
  }
  std::snprintf(buf, sizeof buf, "memcpy   %.1f GB/s (host, 64 MiB, measured %s)\n", t.host_memcpy_gbps,
                t.measured_at.c_str());
  o << buf;
  o << "fingerprint " << t.fingerprint << "\n";
  return o.str();
}

Loaded load_or_measure(const std::string& cache_path, bool force_measure) {
  Loaded r;
  Topology now = probe();
  if (!cache_path.empty() && !force_measure) {
    std::ifstream f(cache_path);
    if (!f) {
      r.why = "no cached topology";
    } else {
      auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      auto cached = j.is_discarded() ? Expected<Topology>(make_error("not JSON")) : from_json(j);
      if (!cached.ok()) {
        r.why = "the cached topology is unreadable (" + cached.message() + ")";
      } else if (cached->fingerprint != now.fingerprint) {
        r.why = "the hardware or driver fingerprint changed";
      } else {
        r.topology = std::move(cached).value();
        // Counts that change without the hardware changing are read fresh.
        r.topology.usable_cpus = now.usable_cpus;
        r.topology.hugepages_free = now.hugepages_free;
        r.topology.transparent_hugepages = now.transparent_hugepages;
        r.from_cache = true;
        r.why = "cache";
        return r;
      }
    }
  } else {
    r.why = cache_path.empty() ? "no cache" : "asked to measure";
  }
  measure(now);
  r.topology = now;
  if (!cache_path.empty()) {  // best effort: a read-only home just means measuring again next time
    std::error_code ec;
    fs::create_directories(fs::path(cache_path).parent_path(), ec);
    const std::string tmp = cache_path + ".tmp." + std::to_string(getpid());
    {
      std::ofstream o(tmp);
      if (o) o << to_json(now).dump(2) << "\n";
    }
    fs::rename(tmp, cache_path, ec);
    if (ec) fs::remove(tmp, ec);
  }
  return r;
}

int default_threads(const Topology& t) {
  if (t.physical_cores <= 0 || t.logical_cpus <= 0) return 0;
  // Usable CPUs over the SMT width: physical cores within the affinity mask (at least one).
  return std::max(1, std::min(t.physical_cores, t.usable_cpus / std::max(1, t.threads_per_core)));
}

}  // namespace ss::topology

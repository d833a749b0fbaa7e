// The topology probe against what the kernel reports by other means (sysconf), the JSON round
// trip, the fingerprint's sensitivity, the cache's re-measurement on a changed fingerprint, and
// the thread default.
#include "topology/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

using namespace ss;
using namespace ss::topology;

TEST(Topology, ProbeAgreesWithSysconf) {
  const Topology t = probe();
  EXPECT_EQ(t.logical_cpus, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_GE(t.physical_cores, 1);
  EXPECT_LE(t.physical_cores, t.logical_cpus);
  EXPECT_LE(t.threads_per_core * t.physical_cores, t.logical_cpus);
  EXPECT_GE(t.usable_cpus, 1);
  EXPECT_LE(t.usable_cpus, t.logical_cpus);
  const int64_t pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  EXPECT_NEAR(double(t.ram_bytes), double(pages) * double(page), 64.0 * 1024 * 1024);
  EXPECT_FALSE(t.fingerprint.empty());
  if (t.gpus.empty()) {
    EXPECT_FALSE(t.gpu_note.empty());
  }
  EXPECT_TRUE(t.measured_at.empty());  // probe() does not measure
}

TEST(Topology, JsonRoundTripAndFingerprint) {
  Topology t = probe();
  measure(t);
  EXPECT_GT(t.host_memcpy_gbps, 0);
  auto back = from_json(to_json(t));
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(to_json(*back), to_json(t));
  EXPECT_EQ(hardware_fingerprint(*back), t.fingerprint);
  Topology other = t;
  other.physical_cores += 1;
  EXPECT_NE(hardware_fingerprint(other), t.fingerprint);
  other = t;
  other.cuda_driver_version += 10;
  EXPECT_NE(hardware_fingerprint(other), t.fingerprint);
  other = t;
  other.host_memcpy_gbps *= 2;  // a measurement is not the hardware
  EXPECT_EQ(hardware_fingerprint(other), t.fingerprint);
  nlohmann::json bad = to_json(t);
  bad.erase("cpu");
  EXPECT_FALSE(from_json(bad).ok());
}

TEST(Topology, CacheIsUsedUntilTheFingerprintChanges) {
  const std::string dir = ::testing::TempDir() + "ss_topology_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::string path = dir + "/topology.json";
  const Loaded first = load_or_measure(path);
  EXPECT_FALSE(first.from_cache);
  ASSERT_TRUE(std::filesystem::exists(path));
  const Loaded second = load_or_measure(path);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.topology.measured_at, first.topology.measured_at);
  EXPECT_EQ(second.topology.host_memcpy_gbps, first.topology.host_memcpy_gbps);
  nlohmann::json j;
  {
    std::ifstream f(path);
    f >> j;
  }
  j["fingerprint"] = "ffffffffffffffff";
  j["bandwidth_gbps"]["host_memcpy"] = -1.0;  // a value no measurement gives
  {
    std::ofstream f(path);
    f << j.dump();
  }
  const Loaded third = load_or_measure(path);
  EXPECT_FALSE(third.from_cache);
  EXPECT_NE(third.why.find("fingerprint"), std::string::npos) << third.why;
  EXPECT_GT(third.topology.host_memcpy_gbps, 0);
  EXPECT_TRUE(load_or_measure(path).from_cache);  // rewritten with the real fingerprint
  EXPECT_FALSE(load_or_measure(path, /*force_measure=*/true).from_cache);
  std::filesystem::remove_all(dir);
}

TEST(Topology, DefaultThreadsIsPhysicalCoresWithinTheAffinity) {
  Topology t;
  t.logical_cpus = 64;
  t.physical_cores = 32;
  t.threads_per_core = 2;
  t.usable_cpus = 64;
  EXPECT_EQ(default_threads(t), 32);
  t.usable_cpus = 16;  // pinned to 16 hyperthreads: 8 cores' worth
  EXPECT_EQ(default_threads(t), 8);
  t.usable_cpus = 1;
  EXPECT_EQ(default_threads(t), 1);
  t.physical_cores = 0;  // unknown: the backend's own default
  EXPECT_EQ(default_threads(t), 0);
}

#include "engine/kv_tiers.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "engine/kv_cache_manager.h"

namespace ss::engine {

namespace {

namespace fs = std::filesystem;

// A disk entry: this header, the block's tokens (int32 x block_size), the payload (the block's
// bytes, zstd-compressed when `compressed`), then the XXH64 of everything before it.
struct FileHeader {
  char magic[8];
  uint64_t model_hash;
  uint32_t dtype;
  uint32_t block_size;
  uint64_t block_bytes;
  uint64_t hash;
  uint64_t parent;
  uint32_t compressed;
  uint32_t reserved;
  uint64_t payload_bytes;
};
static_assert(sizeof(FileHeader) == 64);
constexpr char kMagic[8] = {'S', 'S', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr const char* kExt = ".kvb";
constexpr const char* kTmpExt = ".kvb.tmp";
// Demotions waiting for the writer hold their bytes; past this much, new ones are not written.
constexpr int64_t kMaxQueuedBytes = int64_t(256) << 20;

std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Status write_all(int fd, const void* p, size_t n, const std::string& path) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error(path + ": write failed: " + std::strerror(errno));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

}  // namespace

Status KvTierConfig::validate() const {
  if (host_bytes < 0) return make_error("--kv-host-bytes must be >= 0, got " + std::to_string(host_bytes));
  if (ttl_ms < 0) return make_error("--kv-cache-ttl-ms must be >= 0, got " + std::to_string(ttl_ms));
  if (!disk_dir.empty() && disk_bytes <= 0)
    return make_error("--kv-disk-dir needs --kv-disk-bytes > 0 (the disk tier's bound), got " +
                      std::to_string(disk_bytes));
  if (disk_dir.empty() && disk_bytes > 0) return make_error("--kv-disk-bytes needs --kv-disk-dir");
  return {};
}

Expected<uint64_t> model_file_hash(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(path + ": cannot open to hash it: " + std::strerror(errno));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(size_t(4) << 20);
  ssize_t r;
  while ((r = ::read(fd, buf.data(), buf.size())) != 0) {
    if (r < 0) {
      if (errno == EINTR) continue;
      const std::string err = std::strerror(errno);
      XXH3_freeState(st);
      ::close(fd);
      return make_error(path + ": read failed while hashing: " + err);
    }
    XXH3_64bits_update(st, buf.data(), static_cast<size_t>(r));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  ::close(fd);
  return h;
}

KvTiers::KvTiers(const KvTierConfig& cfg, backend::Backend& be)
    : cfg_(cfg),
      be_(be),
      block_size_(be.kv_config().block_size),
      block_bytes_(be.kv_block_bytes()),
      dtype_(static_cast<uint32_t>(be.kv_config().dtype)) {}

Expected<std::unique_ptr<KvTiers>> KvTiers::create(const KvTierConfig& cfg, backend::Backend& be) {
  SS_TRY(cfg.validate());
  if (be.kv_block_bytes() <= 0)
    return make_error("backend " + be.name() + " cannot copy KV blocks, so it has no host or disk tier");
  std::unique_ptr<KvTiers> t(new KvTiers(cfg, be));
  if (!cfg.disk_dir.empty()) {
    std::error_code ec;
    fs::create_directories(cfg.disk_dir, ec);
    if (ec) return make_error("--kv-disk-dir " + cfg.disk_dir + ": cannot create it: " + ec.message());
    SS_TRY(t->scan_disk());
    t->writer_ = std::thread([p = t.get()] { p->writer_loop(); });
  }
  t->loader_ = std::thread([p = t.get()] { p->loader_loop(); });
  return t;
}

KvTiers::~KvTiers() {
  {
    std::lock_guard<std::mutex> lk(load_mu_);
    load_stop_ = true;
  }
  load_cv_.notify_all();
  if (loader_.joinable()) loader_.join();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string KvTiers::path_of(BlockHash h) const { return cfg_.disk_dir + "/" + hex16(h) + kExt; }

Status KvTiers::read_file(const std::string& path, BlockHash* hash, BlockHash* parent, std::vector<int32_t>* tokens,
                          std::vector<uint8_t>* data, bool* compressed) const {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(path + ": cannot open: " + std::strerror(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    ::close(fd);
    return make_error(path + ": cannot stat");
  }
  const size_t tok_bytes = sizeof(int32_t) * static_cast<size_t>(block_size_);
  const size_t size = static_cast<size_t>(sb.st_size);
  const size_t max_size = sizeof(FileHeader) + tok_bytes + ZSTD_compressBound(static_cast<size_t>(block_bytes_)) + 8;
  if (size < sizeof(FileHeader) + tok_bytes + 8 || size > max_size) {
    ::close(fd);
    return make_error(path + ": " + std::to_string(size) + " bytes is no entry's size (truncated or foreign)");
  }
  std::vector<uint8_t> buf(size);
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(fd, buf.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  if (got != size) return make_error(path + ": short read");
  FileHeader h;
  std::memcpy(&h, buf.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return make_error(path + ": not a KV block file");
  if (h.model_hash != cfg_.model_hash || h.dtype != dtype_ || h.block_size != static_cast<uint32_t>(block_size_) ||
      h.block_bytes != static_cast<uint64_t>(block_bytes_))
    return make_error(path + ": written for another model, KV dtype or block size");
  if (sizeof(FileHeader) + tok_bytes + h.payload_bytes + 8 != size)
    return make_error(path + ": truncated (the header promises " + std::to_string(h.payload_bytes) + " payload bytes)");
  uint64_t sum;
  std::memcpy(&sum, buf.data() + size - 8, 8);
  if (XXH64(buf.data(), size - 8, 0) != sum) return make_error(path + ": checksum mismatch");
  if (!h.compressed && h.payload_bytes != static_cast<uint64_t>(block_bytes_))
    return make_error(path + ": payload size is not a block's");
  tokens->resize(static_cast<size_t>(block_size_));
  std::memcpy(tokens->data(), buf.data() + sizeof h, tok_bytes);
  if (hash_block(h.parent, *tokens) != h.hash) return make_error(path + ": hash does not match its tokens");
  *hash = h.hash;
  *parent = h.parent;
  *compressed = h.compressed != 0;
  if (data) data->assign(buf.begin() + static_cast<std::ptrdiff_t>(sizeof h + tok_bytes), buf.end() - 8);
  return {};
}

Status KvTiers::scan_disk() {
  struct Found {
    fs::file_time_type mtime;
    BlockHash hash, parent;
    std::vector<int32_t> tokens;
    int64_t bytes;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cfg_.disk_dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string path = e.path().string();
    if (ends_with(name, kTmpExt)) {  // a write a crash interrupted
      fs::remove(e.path(), ec);
      ++st_.disk_rejected;
      continue;
    }
    if (!ends_with(name, kExt)) continue;  // not ours: left alone
    Found f;
    bool compressed = false;
    Status s = read_file(path, &f.hash, &f.parent, &f.tokens, nullptr, &compressed);
    if (s.ok() && name != hex16(f.hash) + kExt) s = make_error(path + ": named for another block");
    if (!s.ok()) {
      fs::remove(e.path(), ec);
      ++st_.disk_rejected;
      continue;
    }
    f.bytes = static_cast<int64_t>(e.file_size(ec));
    f.mtime = e.last_write_time(ec);
    found.push_back(std::move(f));
  }
  if (ec) return make_error("--kv-disk-dir " + cfg_.disk_dir + ": cannot list it: " + ec.message());
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (Found& f : found) {
    disk_lru_.push_back(f.hash);
    disk_.emplace(f.hash, DiskEntry{f.parent, std::move(f.tokens), f.bytes, std::prev(disk_lru_.end())});
    disk_used_ += f.bytes;
  }
  while (disk_used_ > cfg_.disk_bytes && !disk_lru_.empty()) {  // the bound may have shrunk
    disk_forget_locked(disk_lru_.front(), false);
    ++st_.disk_dropped;
  }
  return {};
}

void KvTiers::disk_forget_locked(BlockHash h, bool count_rejected) {
  auto it = disk_.find(h);
  if (it == disk_.end()) return;
  std::error_code ec;
  fs::remove(path_of(h), ec);
  disk_used_ -= it->second.bytes;
  disk_lru_.erase(it->second.lru);
  disk_.erase(it);
  if (count_rejected) ++st_.disk_rejected;
}

Status KvTiers::write_file(const DiskJob& j, int64_t* bytes) {
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.model_hash = cfg_.model_hash;
  h.dtype = dtype_;
  h.block_size = static_cast<uint32_t>(block_size_);
  h.block_bytes = static_cast<uint64_t>(block_bytes_);
  h.hash = j.hash;
  h.parent = j.parent;
  h.compressed = j.compressed ? 1 : 0;
  h.payload_bytes = j.data->size();
  XXH64_state_t* xs = XXH64_createState();
  XXH64_reset(xs, 0);
  XXH64_update(xs, &h, sizeof h);
  XXH64_update(xs, j.tokens.data(), sizeof(int32_t) * j.tokens.size());
  XXH64_update(xs, j.data->data(), j.data->size());
  const uint64_t sum = XXH64_digest(xs);
  XXH64_freeState(xs);

  const std::string path = path_of(j.hash), tmp = cfg_.disk_dir + "/" + hex16(j.hash) + kTmpExt;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(tmp + ": cannot create: " + std::strerror(errno));
  Status s = write_all(fd, &h, sizeof h, tmp);
  if (s.ok()) s = write_all(fd, j.tokens.data(), sizeof(int32_t) * j.tokens.size(), tmp);
  if (s.ok()) s = write_all(fd, j.data->data(), j.data->size(), tmp);
  if (s.ok()) s = write_all(fd, &sum, sizeof sum, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = make_error(tmp + ": fsync failed: " + std::strerror(errno));
  if (::close(fd) != 0 && s.ok()) s = make_error(tmp + ": close failed: " + std::strerror(errno));
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    s = make_error(path + ": rename failed: " + std::strerror(errno));
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // The rename is durable once the directory is synced.
  if (const int dfd = ::open(cfg_.disk_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  *bytes = static_cast<int64_t>(sizeof h + sizeof(int32_t) * j.tokens.size() + j.data->size() + sizeof sum);
  return {};
}

void KvTiers::writer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and every queued write done
    DiskJob j = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= static_cast<int64_t>(j.data->size());
    writing_ = true;
    const int64_t need = static_cast<int64_t>(sizeof(FileHeader) + sizeof(int32_t) * j.tokens.size() + j.data->size() + 8);
    const bool skip = st_.disk_writes_stopped || disk_.count(j.hash) || need > cfg_.disk_bytes;
    if (!skip)
      while (disk_used_ + need > cfg_.disk_bytes && !disk_lru_.empty()) {
        disk_forget_locked(disk_lru_.front(), false);
        ++st_.disk_dropped;
      }
    lk.unlock();
    int64_t bytes = 0;
    Status s = skip ? Status{} : write_file(j, &bytes);
    lk.lock();
    queued_.erase(j.hash);
    if (!skip) {
      if (s.ok()) {
        disk_lru_.push_back(j.hash);
        disk_.emplace(j.hash, DiskEntry{j.parent, std::move(j.tokens), bytes, std::prev(disk_lru_.end())});
        disk_used_ += bytes;
        ++st_.disk_writes;
      } else {  // disk full or failing: stop writing, keep serving (what is on disk stays usable)
        ++st_.disk_write_errors;
        st_.disk_writes_stopped = true;
        std::fprintf(stderr, "kv disk tier: %s; no more writes to %s\n", s.message().c_str(), cfg_.disk_dir.c_str());
      }
    }
    writing_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void KvTiers::wait_for_writes() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return (queue_.empty() && !writing_) || !writer_.joinable(); });
}

void KvTiers::host_insert(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens,
                          std::shared_ptr<const std::vector<uint8_t>> data, bool compressed) {
  if (cfg_.host_bytes <= 0) return;
  if (auto it = host_.find(hash); it != host_.end()) {
    host_lru_.splice(host_lru_.end(), host_lru_, it->second.lru);
    return;
  }
  const int64_t n = static_cast<int64_t>(data->size());
  if (n > cfg_.host_bytes) return;
  while (host_used_ + n > cfg_.host_bytes && !host_lru_.empty()) {
    auto it = host_.find(host_lru_.front());
    host_used_ -= static_cast<int64_t>(it->second.data->size());
    host_.erase(it);
    host_lru_.pop_front();
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.host_dropped;
  }
  host_lru_.push_back(hash);
  host_.emplace(hash, HostEntry{parent, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(data), compressed,
                                std::prev(host_lru_.end())});
  host_used_ += n;
}

void KvTiers::demote(BlockId b, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, Why why) {
  const auto count = [&] {  // under mu_
    if (why == Why::Idle) ++st_.demoted_idle;
    else if (why == Why::Evicted) ++st_.demoted_evicted;
  };
  const bool disk_on = !cfg_.disk_dir.empty();
  const auto hit = host_.find(hash);
  bool need_disk = false;
  if (disk_on) {
    std::lock_guard<std::mutex> lk(mu_);
    need_disk = !st_.disk_writes_stopped && !disk_.count(hash) && !queued_.count(hash);
  }
  if (hit != host_.end() && !need_disk) {  // already kept: only fresher now
    host_lru_.splice(host_lru_.end(), host_lru_, hit->second.lru);
    std::lock_guard<std::mutex> lk(mu_);
    count();
    return;
  }
  if (cfg_.host_bytes <= 0 && !need_disk) return;
  std::shared_ptr<const std::vector<uint8_t>> data;
  bool compressed = false;
  if (!cfg_.host_compress) {  // straight into the entry's own buffer, pre-faulted by the loader
    std::unique_ptr<std::vector<uint8_t>> buf = take_spare();
    if (!be_.read_kv_block(b, *buf).ok()) return;  // the block is then only dropped
    data = std::shared_ptr<const std::vector<uint8_t>>(std::move(buf));
  } else {
    raw_.resize(static_cast<size_t>(block_bytes_));
    if (!be_.read_kv_block(b, raw_).ok()) return;
  }
  if (cfg_.host_compress) {
    packed_.resize(ZSTD_compressBound(raw_.size()));
    const size_t r = ZSTD_compress(packed_.data(), packed_.size(), raw_.data(), raw_.size(), 1);
    if (!ZSTD_isError(r) && r < raw_.size()) {
      data = std::make_shared<const std::vector<uint8_t>>(packed_.begin(), packed_.begin() + static_cast<std::ptrdiff_t>(r));
      compressed = true;
    }
  }
  if (!data) data = std::make_shared<const std::vector<uint8_t>>(raw_);  // compressed no smaller: kept raw
  host_insert(hash, parent, tokens, data, compressed);
  std::lock_guard<std::mutex> lk(mu_);
  count();
  if (need_disk) {
    if (queued_bytes_ + static_cast<int64_t>(data->size()) > kMaxQueuedBytes) {
      ++st_.disk_write_errors;  // the writer is that far behind: this block is not written
      return;
    }
    queued_bytes_ += static_cast<int64_t>(data->size());
    queued_.insert(hash);
    queue_.push_back(DiskJob{hash, parent, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(data), compressed});
    cv_.notify_one();
  }
}

KvTiers::Where KvTiers::find(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const {
  auto same = [&](BlockHash p, const std::vector<int32_t>& t) {
    return p == parent && std::equal(t.begin(), t.end(), tokens.begin(), tokens.end());
  };
  if (auto it = host_.find(hash); it != host_.end() && same(it->second.parent, it->second.tokens)) return Where::Host;
  if (cfg_.disk_dir.empty()) return Where::None;
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = disk_.find(hash); it != disk_.end() && same(it->second.parent, it->second.tokens)) return Where::Disk;
  return Where::None;
}

bool KvTiers::unpack(const std::vector<uint8_t>& data, bool compressed, std::vector<uint8_t>& out) const {
  out.resize(static_cast<size_t>(block_bytes_));
  if (!compressed) {
    if (data.size() != out.size()) return false;
    std::memcpy(out.data(), data.data(), out.size());
    return true;
  }
  const size_t r = ZSTD_decompress(out.data(), out.size(), data.data(), data.size());
  return !ZSTD_isError(r) && r == out.size();
}

bool KvTiers::restore(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, BlockId b) {
  const Where w = find(hash, parent, tokens);
  if (w == Where::Host) {
    HostEntry& e = host_.at(hash);
    host_lru_.splice(host_lru_.end(), host_lru_, e.lru);
    Status s;
    if (e.compressed) {
      if (!unpack(*e.data, true, raw_)) return false;
      s = be_.write_kv_block(b, raw_);
    } else {
      s = be_.write_kv_block(b, *e.data);
    }
    if (!s.ok()) return false;
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.restored_host;
    return true;
  }
  if (w != Where::Disk) return false;
  std::vector<uint8_t> data;
  bool compressed = false;
  {
    std::lock_guard<std::mutex> lk(mu_);  // the writer never removes the file under a read
    auto it = disk_.find(hash);
    if (it == disk_.end()) return false;
    BlockHash fh = 0, fp = 0;
    std::vector<int32_t> ft;
    Status s = read_file(path_of(hash), &fh, &fp, &ft, &data, &compressed);
    if (s.ok() && (fh != hash || fp != parent || !std::equal(ft.begin(), ft.end(), tokens.begin(), tokens.end())))
      s = make_error("entry does not hold this block");
    if (!s.ok() || !unpack(data, compressed, raw_)) {
      std::fprintf(stderr, "kv disk tier: %s; deleted\n", s.ok() ? "payload does not decompress" : s.message().c_str());
      disk_forget_locked(hash, true);
      return false;
    }
    disk_lru_.splice(disk_lru_.end(), disk_lru_, it->second.lru);
  }
  if (!be_.write_kv_block(b, raw_).ok()) return false;
  host_insert(hash, parent, tokens, std::make_shared<const std::vector<uint8_t>>(std::move(data)), compressed);
  std::lock_guard<std::mutex> lk(mu_);
  ++st_.restored_disk;
  return true;
}

namespace {
// A delivered block whose bytes are a copy of its own (read from disk or decompressed), not the
// host tier's: counted as staging memory until taken.
bool owns_copy(const KvTiers::Loaded& l) { return l.bytes && (l.from_disk || l.compressed); }
}  // namespace

uint64_t KvTiers::load_async(std::span<const LoadItem> items) {
  // Host entries are resolved here (the host index is the engine thread's); their bytes are shared,
  // immutable, so the loader reads them even if the host tier drops the entry meanwhile.
  std::vector<LoadJob> jobs;
  jobs.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const LoadItem& it = items[i];
    LoadJob j{0, static_cast<int>(i), it, find(it.hash, it.parent, it.tokens), nullptr, false};
    if (j.where == Where::Host) {
      const HostEntry& e = host_.at(it.hash);
      j.host_data = e.data;
      j.host_compressed = e.compressed;
    }
    jobs.push_back(std::move(j));
  }
  std::lock_guard<std::mutex> lk(load_mu_);  // never held with mu_ (find() takes that one)
  const uint64_t ticket = ++next_ticket_;
  for (LoadJob& j : jobs) {
    j.ticket = ticket;
    loads_.push_back(std::move(j));
  }
  load_cv_.notify_one();
  return ticket;
}

void KvTiers::cancel_load(uint64_t ticket) {
  std::lock_guard<std::mutex> lk(load_mu_);
  std::erase_if(loads_, [&](const LoadJob& j) { return j.ticket == ticket; });
  std::erase_if(ready_, [&](const Loaded& l) {
    if (l.ticket != ticket) return false;
    if (owns_copy(l)) staging_bytes_ -= static_cast<int64_t>(l.bytes->size());
    return true;
  });
  if (loading_ticket_ == ticket) loading_cancelled_ = true;
}

int KvTiers::take_loaded(int max, std::vector<Loaded>& out) {
  std::lock_guard<std::mutex> lk(load_mu_);
  int n = 0;
  while (n < max && !ready_.empty()) {
    Loaded& l = ready_.front();
    if (owns_copy(l)) staging_bytes_ -= static_cast<int64_t>(l.bytes->size());
    out.push_back(std::move(l));
    ready_.pop_front();
    ++n;
  }
  return n;
}

bool KvTiers::wait_loaded(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(load_mu_);
  return ready_cv_.wait_for(lk, timeout, [&] { return !ready_.empty() || load_stop_; }) && !ready_.empty();
}

void KvTiers::set_load_hook(std::function<void(BlockHash)> hook) {
  std::lock_guard<std::mutex> lk(load_mu_);
  load_hook_ = std::move(hook);
}

std::unique_ptr<std::vector<uint8_t>> KvTiers::take_spare() {
  {
    std::lock_guard<std::mutex> lk(load_mu_);
    if (!spare_.empty()) {
      auto b = std::move(spare_.back());
      spare_.pop_back();
      load_cv_.notify_one();  // the loader tops the spares up
      return b;
    }
  }
  return std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(block_bytes_));
}

void KvTiers::loader_loop() {
  std::unique_lock<std::mutex> lk(load_mu_);
  const size_t spares = cfg_.host_compress ? 0 : kSpareBuffers;
  for (;;) {
    load_cv_.wait(lk, [&] { return load_stop_ || !loads_.empty() || spare_.size() < spares; });
    if (load_stop_) return;
    if (loads_.empty()) {  // idle: fault in a block buffer for the next demotion, off the engine thread
      lk.unlock();
      auto b = std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(block_bytes_));  // zeroed: touched
      lk.lock();
      spare_.push_back(std::move(b));
      continue;
    }
    LoadJob j = std::move(loads_.front());
    loads_.pop_front();
    loading_ticket_ = j.ticket;
    loading_cancelled_ = false;
    const auto hook = load_hook_;
    lk.unlock();
    if (hook) hook(j.item.hash);
    Loaded l = load_one(j);
    lk.lock();
    loading_ticket_ = 0;
    if (loading_cancelled_) continue;
    if (!l.ok) ++load_failures_;
    if (owns_copy(l)) staging_bytes_ += static_cast<int64_t>(l.bytes->size());
    ready_.push_back(std::move(l));
    ready_cv_.notify_all();
  }
}

KvTiers::Loaded KvTiers::load_one(const LoadJob& j) {
  Loaded l;
  l.ticket = j.ticket;
  l.index = j.index;
  if (j.where == Where::Host) {
    if (!j.host_compressed) {
      l.bytes = j.host_data;  // no copy: the host tier's bytes are the staging memory
    } else {
      auto raw = std::make_shared<std::vector<uint8_t>>();
      if (!unpack(*j.host_data, true, *raw)) return l;
      l.bytes = std::move(raw);
      l.compressed = true;
    }
    l.ok = true;
    return l;
  }
  if (j.where != Where::Disk) return l;
  // The file is read without the lock (the engine thread's find() and demote() take it): the writer
  // may remove or replace it meanwhile, which the open, the checksum and the token check catch.
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!disk_.count(j.item.hash)) return l;
  }
  auto data = std::make_shared<std::vector<uint8_t>>();
  auto raw = std::make_shared<std::vector<uint8_t>>();
  bool compressed = false;
  BlockHash fh = 0, fp = 0;
  std::vector<int32_t> ft;
  Status s = read_file(path_of(j.item.hash), &fh, &fp, &ft, data.get(), &compressed);
  if (s.ok() && (fh != j.item.hash || fp != j.item.parent || ft != j.item.tokens))
    s = make_error("entry does not hold this block");
  if (s.ok() && !unpack(*data, compressed, *raw)) s = make_error("payload does not decompress");
  std::lock_guard<std::mutex> lk(mu_);
  if (!s.ok()) {
    std::fprintf(stderr, "kv disk tier: %s; deleted\n", s.message().c_str());
    disk_forget_locked(j.item.hash, true);
    return l;
  }
  if (auto it = disk_.find(j.item.hash); it != disk_.end()) disk_lru_.splice(disk_lru_.end(), disk_lru_, it->second.lru);
  l.ok = true;
  l.from_disk = true;
  l.compressed = compressed;
  l.bytes = std::move(raw);
  l.stored = std::move(data);
  return l;
}

bool KvTiers::apply_load(const Loaded& l, const LoadItem& item, BlockId b) {
  if (!l.ok || !l.bytes || !be_.write_kv_block(b, *l.bytes).ok()) return false;
  if (l.from_disk) {
    host_insert(item.hash, item.parent, item.tokens, l.stored, l.compressed);
  } else if (auto it = host_.find(item.hash); it != host_.end()) {
    host_lru_.splice(host_lru_.end(), host_lru_, it->second.lru);
  }
  std::lock_guard<std::mutex> lk(mu_);
  ++(l.from_disk ? st_.restored_disk : st_.restored_host);
  return true;
}

KvTierStats KvTiers::stats() const {
  int64_t pending = 0, ready = 0, failures = 0, staging = 0;
  {
    std::lock_guard<std::mutex> lk(load_mu_);
    ready = static_cast<int64_t>(ready_.size());
    pending = static_cast<int64_t>(loads_.size() + ready_.size()) + (loading_ticket_ && !loading_cancelled_ ? 1 : 0);
    failures = load_failures_;
    staging = staging_bytes_;
  }
  std::lock_guard<std::mutex> lk(mu_);
  KvTierStats s = st_;
  s.loads_pending = pending;
  s.loads_ready = ready;
  s.load_failures = failures;
  s.staging_bytes = staging;
  s.host_capacity_bytes = cfg_.host_bytes;
  s.host_used_bytes = host_used_;
  s.host_blocks = static_cast<int64_t>(host_.size());
  s.disk_capacity_bytes = cfg_.disk_dir.empty() ? 0 : cfg_.disk_bytes;
  s.disk_used_bytes = disk_used_;
  s.disk_blocks = static_cast<int64_t>(disk_.size());
  return s;
}

}  // namespace ss::engine

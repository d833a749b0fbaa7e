#include "engine/kv_tiers.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "engine/kv_cache_manager.h"
#include "engine/kv_host_arena.h"

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
// Demotions waiting for the writer hold their bytes up to this much (KvTierConfig::disk_queue_bytes
// by default). Without a host tier this is also the size of the arena the queue's bytes live in.
constexpr int64_t kMaxQueuedBytes = int64_t(256) << 20;
// A compressed block takes whole chunks: a 32nd of a block wastes ~1.5% of it on average.
constexpr int64_t kChunksPerCompressedBlock = 32;

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
  if (disk_queue_bytes < 0) return make_error("the disk write queue's bound must be >= 0, got " + std::to_string(disk_queue_bytes));
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
  const int64_t bb = t->block_bytes_;
  // Plain blocks take one chunk each (read in place); compressed ones as many small chunks as they need.
  const int64_t chunk = cfg.host_compress ? std::max<int64_t>(16, (bb / kChunksPerCompressedBlock + 15) / 16 * 16) : bb;
  if (cfg.host_bytes > 0 && cfg.host_bytes < bb)
    return make_error("--kv-host-bytes " + std::to_string(cfg.host_bytes) + " holds no KV block (a block is " +
                      std::to_string(bb) + " bytes)");
  t->queue_bound_ = cfg.disk_queue_bytes > 0 ? cfg.disk_queue_bytes : kMaxQueuedBytes;
  if (cfg.host_bytes > 0 || !cfg.disk_dir.empty()) {
    const int64_t bytes = cfg.host_bytes > 0 ? cfg.host_bytes : std::max(bb, std::min(t->queue_bound_, cfg.disk_bytes));
    SS_ASSIGN(t->arena_, HostArena::create(bytes, chunk));
  }
  t->raw_.resize(static_cast<size_t>(bb));  // zero-filled: faulted in now, not at the first demotion
  // The arena and raw_ are where blocks are copied out of and into the backend: registered, a GPU
  // moves them by DMA in place instead of through its staging buffers.
  if (t->arena_) be.register_host_memory(const_cast<uint8_t*>(t->arena_->begin()), static_cast<size_t>(t->arena_->bytes()));
  be.register_host_memory(t->raw_.data(), t->raw_.size());
  t->registered_ = true;
  if (cfg.host_compress) {
    t->packed_.resize(ZSTD_compressBound(static_cast<size_t>(bb)));
    t->cctx_ = ZSTD_createCCtx();
  }
  t->dctx_ = ZSTD_createDCtx();
  t->loader_dctx_ = ZSTD_createDCtx();
  if ((cfg.host_compress && !t->cctx_) || !t->dctx_ || !t->loader_dctx_) return make_error("zstd: cannot create a context");
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
  if (registered_) {
    if (arena_) be_.unregister_host_memory(const_cast<uint8_t*>(arena_->begin()));
    be_.unregister_host_memory(raw_.data());
  }
  ZSTD_freeCCtx(cctx_);
  ZSTD_freeDCtx(dctx_);
  ZSTD_freeDCtx(loader_dctx_);
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
    kid_add_locked(f.hash, f.parent);
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
  if (!pending_.count(h)) kid_remove_locked(h, it->second.parent);
  disk_used_ -= it->second.bytes;
  disk_lru_.erase(it->second.lru);
  disk_.erase(it);
  if (count_rejected) ++st_.disk_rejected;
}

void KvTiers::kid_add_locked(BlockHash h, BlockHash parent) { kids_.emplace(parent, h); }

void KvTiers::kid_remove_locked(BlockHash h, BlockHash parent) {
  const auto [b, e] = kids_.equal_range(parent);
  for (auto it = b; it != e; ++it)
    if (it->second == h) {
      kids_.erase(it);
      return;
    }
}

bool KvTiers::has_queued_kid_locked(BlockHash h) const {
  const auto [b, e] = kids_.equal_range(h);
  for (auto it = b; it != e; ++it)
    if (const auto p = pending_.find(it->second); p != pending_.end() && !p->second.cancelled) return true;
  return false;
}

void KvTiers::drop_chain_locked(BlockHash h) {
  std::vector<BlockHash> todo{h};
  while (!todo.empty()) {
    const BlockHash x = todo.back();
    todo.pop_back();
    const auto [b, e] = kids_.equal_range(x);
    for (auto it = b; it != e; ++it) todo.push_back(it->second);
    bool dropped = false;
    if (auto p = pending_.find(x); p != pending_.end() && !p->second.cancelled) {
      dropped = true;
      if (writing_ && writing_hash_ == x) {  // the writer holds it: it discards the file when done
        p->second.cancelled = true;
      } else {
        queue_.erase(std::find(queue_.begin(), queue_.end(), x));
        queued_bytes_ -= p->second.data->held_bytes();
        if (!disk_.count(x)) kid_remove_locked(x, p->second.parent);
        pending_.erase(p);
      }
    }
    if (disk_.count(x)) {
      dropped = true;
      disk_forget_locked(x, false);
    }
    if (dropped) ++st_.disk_behind_dropped;
  }
}

bool KvTiers::make_queue_room_locked(int64_t need, BlockHash keep_parent) {
  while (queued_bytes_ + need > queue_bound_) {
    // The newest queued block no other queued block descends from: the tail of the newest chain.
    // The one being written is a candidate too (cancelling it frees its bytes once it is done).
    BlockHash victim = 0;
    bool found = false;
    for (auto it = queue_.rbegin(); it != queue_.rend() && !found; ++it)
      if (*it != keep_parent && !has_queued_kid_locked(*it)) victim = *it, found = true;
    if (!found && writing_ && writing_hash_ != keep_parent && !pending_.at(writing_hash_).cancelled &&
        !has_queued_kid_locked(writing_hash_))
      victim = writing_hash_, found = true;
    if (!found) return false;
    drop_chain_locked(victim);
  }
  return true;
}

Status KvTiers::write_file(BlockHash hash, const DiskJob& j, int64_t* bytes) {
  const ArenaBytes& data = *j.data;
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.model_hash = cfg_.model_hash;
  h.dtype = dtype_;
  h.block_size = static_cast<uint32_t>(block_size_);
  h.block_bytes = static_cast<uint64_t>(block_bytes_);
  h.hash = hash;
  h.parent = j.parent;
  h.compressed = data.compressed() ? 1 : 0;
  h.payload_bytes = static_cast<uint64_t>(data.size());
  XXH64_state_t* xs = XXH64_createState();
  XXH64_reset(xs, 0);
  XXH64_update(xs, &h, sizeof h);
  XXH64_update(xs, j.tokens.data(), sizeof(int32_t) * j.tokens.size());
  for (int i = 0; i < data.num_pieces(); ++i) XXH64_update(xs, data.piece(i).data(), data.piece(i).size());
  const uint64_t sum = XXH64_digest(xs);
  XXH64_freeState(xs);

  const std::string path = path_of(hash), tmp = cfg_.disk_dir + "/" + hex16(hash) + kTmpExt;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(tmp + ": cannot create: " + std::strerror(errno));
  Status s = write_all(fd, &h, sizeof h, tmp);
  if (s.ok()) s = write_all(fd, j.tokens.data(), sizeof(int32_t) * j.tokens.size(), tmp);
  for (int i = 0; s.ok() && i < data.num_pieces(); ++i) s = write_all(fd, data.piece(i).data(), data.piece(i).size(), tmp);
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
  *bytes = static_cast<int64_t>(sizeof h + sizeof(int32_t) * j.tokens.size() + static_cast<size_t>(data.size()) + sizeof sum);
  return {};
}

void KvTiers::writer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and every queued write done
    const BlockHash hash = queue_.front();
    queue_.pop_front();
    // Only this thread erases from pending_, and nodes do not move: j stays valid unlocked.
    const auto pit = pending_.find(hash);
    DiskJob& j = pit->second;
    writing_ = true;
    writing_hash_ = hash;
    const int64_t need = static_cast<int64_t>(sizeof(FileHeader) + sizeof(int32_t) * j.tokens.size()) + j.data->size() + 8;
    const bool skip = st_.disk_writes_stopped || disk_.count(hash) || need > cfg_.disk_bytes;
    if (!skip)
      while (disk_used_ + need > cfg_.disk_bytes && !disk_lru_.empty()) {
        disk_forget_locked(disk_lru_.front(), false);
        ++st_.disk_dropped;
      }
    const auto hook = write_hook_;
    lk.unlock();
    if (hook) hook(hash);
    int64_t bytes = 0;
    Status s = skip ? Status{} : write_file(hash, j, &bytes);
    lk.lock();
    if (!skip && s.ok() && j.cancelled) {  // its chain was dropped above it meanwhile: not kept
      std::error_code ec;
      fs::remove(path_of(hash), ec);
    } else if (!skip) {
      if (s.ok()) {
        disk_lru_.push_back(hash);
        disk_.emplace(hash, DiskEntry{j.parent, j.tokens, bytes, std::prev(disk_lru_.end())});
        disk_used_ += bytes;
        ++st_.disk_writes;
      } else {  // disk full or failing: stop writing, keep serving (what is on disk stays usable)
        ++st_.disk_write_errors;
        st_.disk_writes_stopped = true;
        std::fprintf(stderr, "kv disk tier: %s; no more writes to %s\n", s.message().c_str(), cfg_.disk_dir.c_str());
      }
    }
    // Out of the queue only now that the file is indexed: a restore finds the block in one or the
    // other all along. The bytes go back to the arena unless the host tier keeps them.
    queued_bytes_ -= j.data->held_bytes();
    if (!disk_.count(hash)) kid_remove_locked(hash, j.parent);
    pending_.erase(pit);
    ++writes_done_;
    writing_ = false;
    progress_cv_.notify_all();
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void KvTiers::wait_for_writes() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return (queue_.empty() && !writing_) || !writer_.joinable(); });
}

void KvTiers::set_write_hook(std::function<void(BlockHash)> hook) {
  std::lock_guard<std::mutex> lk(mu_);
  write_hook_ = std::move(hook);
}

std::pair<const uint8_t*, const uint8_t*> KvTiers::arena_range() const {
  if (!arena_) return {nullptr, nullptr};
  return {arena_->begin(), arena_->end()};
}

const uint8_t* KvTiers::host_bytes_of(BlockHash hash) const {
  const auto it = host_.find(hash);
  return it == host_.end() ? nullptr : it->second.data->piece(0).data();
}

bool KvTiers::host_drop_one() {
  for (auto it = host_lru_.begin(); it != host_lru_.end(); ++it) {
    const auto e = host_.find(*it);
    if (e->second.data.use_count() > 1) continue;  // a queued write or a load holds it: dropping frees nothing
    host_.erase(e);
    host_lru_.erase(it);
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.host_dropped;
    return true;
  }
  return false;
}

std::shared_ptr<ArenaBytes> KvTiers::arena_alloc(int64_t size, bool compressed, bool may_wait) {
  if (!arena_) return nullptr;
  const int64_t cb = arena_->chunk_bytes();
  const int64_t n = (size + cb - 1) / cb;
  if (n > arena_->num_chunks()) return nullptr;
  std::vector<uint32_t> chunks;
  chunks.reserve(static_cast<size_t>(n));
  for (;;) {
    if (arena_->take(static_cast<int>(n), chunks))
      return std::make_shared<ArenaBytes>(arena_, std::move(chunks), size, compressed);
    if (host_drop_one()) continue;
    if (!may_wait) return nullptr;
    // Every chunk is held by queued writes (or loads): wait for the writer to finish one.
    std::unique_lock<std::mutex> lk(mu_);
    if (queue_.empty() && !writing_) return nullptr;  // nothing that will let go soon
    const uint64_t done = writes_done_;
    progress_cv_.wait(lk, [&] { return writes_done_ != done || (queue_.empty() && !writing_); });
  }
}

std::shared_ptr<const ArenaBytes> KvTiers::read_block(BlockId b, bool may_wait) {
  std::shared_ptr<ArenaBytes> a;
  if (!cfg_.host_compress) {  // straight into its chunk
    a = arena_alloc(block_bytes_, false, may_wait);
    if (a && !be_.read_kv_block(b, a->piece(0)).ok()) return nullptr;  // the block is then only dropped
  } else {
    if (!be_.read_kv_block(b, raw_).ok()) return nullptr;
    const size_t r = ZSTD_compressCCtx(cctx_, packed_.data(), packed_.size(), raw_.data(), raw_.size(), 1);
    const bool z = !ZSTD_isError(r) && r < raw_.size();  // compressed no smaller: kept raw
    const std::span<const uint8_t> src = z ? std::span<const uint8_t>(packed_.data(), r) : std::span<const uint8_t>(raw_);
    a = arena_alloc(static_cast<int64_t>(src.size()), z, may_wait);
    if (a) a->copy_in(src);
  }
  if (!a) {
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.demote_no_room;
  }
  return a;
}

void KvTiers::host_adopt(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens,
                         std::shared_ptr<const ArenaBytes> data) {
  if (cfg_.host_bytes <= 0) return;
  if (auto it = host_.find(hash); it != host_.end()) {
    host_lru_.splice(host_lru_.end(), host_lru_, it->second.lru);
    return;
  }
  host_lru_.push_back(hash);
  host_.emplace(hash, HostEntry{parent, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(data),
                                std::prev(host_lru_.end())});
}

void KvTiers::host_insert_copy(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens,
                               std::span<const uint8_t> stored, bool compressed) {
  if (cfg_.host_bytes <= 0) return;
  if (auto it = host_.find(hash); it != host_.end()) {
    host_lru_.splice(host_lru_.end(), host_lru_, it->second.lru);
    return;
  }
  std::shared_ptr<ArenaBytes> a = arena_alloc(static_cast<int64_t>(stored.size()), compressed, false);
  if (!a) return;  // no room: the block stays on disk only
  a->copy_in(stored);
  host_adopt(hash, parent, tokens, std::move(a));
}

void KvTiers::count_demoted(Why why) {
  if (why == Why::Idle) ++st_.demoted_idle;
  else if (why == Why::Evicted) ++st_.demoted_evicted;
}

void KvTiers::demote(BlockId b, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, Why why) {
  const CachedBlock one{b, hash, parent, tokens};
  demote(std::span<const CachedBlock>(&one, 1), why);
}

// Each block's steps are the single demotion's, split at its read: what comes before the read
// runs now, the read and what follows it at the flush, in order. A block joins the pending ones
// only where it sees what it would have seen with them done (else they are flushed first and it
// begins again): its disk queue room is there with theirs taken (so no room-making, which could
// drop chains they would have joined, runs before they are queued), and its chunk is there
// without pushing out host entries they would have refreshed or added (theirs are held until the
// flush, so arena_alloc cannot take them and fails instead). A pending block's parent_kept is
// read at its flush, after the blocks before it were queued, as it would have been read then.
void KvTiers::demote(std::span<const CachedBlock> blocks, Why why) {
  const bool disk_on = !cfg_.disk_dir.empty();
  const int64_t plain_need = arena_ ? (block_bytes_ + arena_->chunk_bytes() - 1) / arena_->chunk_bytes() * arena_->chunk_bytes()
                                    : block_bytes_;
  demoting_.clear();
  int64_t reserved = 0;  // the disk queue bytes the pending blocks will take
  const auto flush = [&] {
    flush_demotions(why);
    reserved = 0;
  };
  for (size_t i = 0; i < blocks.size();) {
    const CachedBlock& d = blocks[i];
    const bool first = demoting_.empty();
    const auto hit = host_.find(d.hash);
    bool need_disk = false, parent_kept = false;
    int64_t queued = 0;
    if (disk_on) {
      std::lock_guard<std::mutex> lk(mu_);
      need_disk = !st_.disk_writes_stopped && !disk_.count(d.hash) && !pending_.count(d.hash);
      parent_kept = pending_.count(d.parent) || disk_.count(d.parent);
      queued = queued_bytes_;
    }
    if (hit != host_.end() && !need_disk) {  // already kept: only fresher now
      demoting_.push_back({PendingDemotion::Refresh, &d, false, false, first, hit->second.data});
      ++i;
      continue;
    }
    if (cfg_.host_bytes <= 0 && !need_disk) {
      ++i;
      continue;
    }
    const int64_t need = hit != host_.end() ? hit->second.data->held_bytes() : plain_need;
    if (need_disk && !first && queued + reserved + need > queue_bound_) {  // room-making would run: flush first
      flush();
      continue;
    }
    if (hit != host_.end()) {  // kept, not yet on disk: the write shares the host entry's bytes
      demoting_.push_back({PendingDemotion::Share, &d, need_disk, parent_kept, first, hit->second.data});
      reserved += need;
      ++i;
      continue;
    }
    if (cfg_.host_compress) {  // read and compressed now, as the single demotion did: nothing pending before it
      if (!first) {
        flush();
        continue;
      }
      if (need_disk && why != Why::Shutdown) {  // room in the queue first (as below)
        std::lock_guard<std::mutex> lk(mu_);
        make_queue_room_locked(block_bytes_, d.parent);
      }
      std::shared_ptr<const ArenaBytes> data = read_block(d.block, why == Why::Shutdown);
      ++i;
      if (!data) {
        if (need_disk) {  // not read (no arena room): not written, nor anything below it in its chain
          std::lock_guard<std::mutex> lk(mu_);
          drop_chain_locked(d.hash);
          ++st_.disk_behind_dropped;
        }
        continue;
      }
      demoting_.push_back({PendingDemotion::Copied, &d, need_disk, parent_kept, true, std::move(data)});
      flush();
      continue;
    }
    std::shared_ptr<ArenaBytes> a;
    if (first) {
      // A shutdown copy may wait for the writer to free room; a demotion between steps never waits.
      if (need_disk && why != Why::Shutdown) {  // room in the queue first: without a host tier its bytes are the arena's
        std::lock_guard<std::mutex> lk(mu_);
        make_queue_room_locked(block_bytes_, d.parent);
      }
      a = arena_alloc(block_bytes_, false, why == Why::Shutdown);
      if (!a) {
        std::lock_guard<std::mutex> lk(mu_);
        ++st_.demote_no_room;
        if (need_disk) {  // not read (no arena room): not written, nor anything below it in its chain
          drop_chain_locked(d.hash);
          ++st_.disk_behind_dropped;
        }
        ++i;
        continue;
      }
    } else if (a = arena_alloc(block_bytes_, false, false); !a) {  // room only once the pending ones are in
      flush();
      continue;
    }
    demoting_.push_back({PendingDemotion::Read, &d, need_disk, parent_kept, first, std::move(a)});
    if (need_disk) reserved += need;
    ++i;
  }
  flush_demotions(why);
}

void KvTiers::flush_demotions(Why why) {
  // Every block that goes straight into its chunk, in one copy (a GPU: every DMA issued, one wait).
  reads_.clear();
  for (const PendingDemotion& p : demoting_)
    if (p.kind == PendingDemotion::Read) reads_.push_back(backend::KvBlockOut{p.blk->block, p.data->piece(0)});
  read_ok_.assign(reads_.size(), 1);
  if (!reads_.empty() && !be_.read_kv_blocks(reads_).ok())  // which failed? each alone: only those are dropped
    for (size_t r = 0; r < reads_.size(); ++r) read_ok_[r] = be_.read_kv_block(reads_[r].block, reads_[r].bytes).ok();
  size_t r = 0;
  for (PendingDemotion& p : demoting_) {
    const CachedBlock& d = *p.blk;
    if (p.kind == PendingDemotion::Read && !read_ok_[r++]) {
      p.data.reset();  // the block is then only dropped
      if (p.need_disk) {  // not read: not written, nor anything below it in its chain
        std::lock_guard<std::mutex> lk(mu_);
        drop_chain_locked(d.hash);
        ++st_.disk_behind_dropped;
      }
      continue;
    }
    if (p.kind == PendingDemotion::Refresh || p.kind == PendingDemotion::Share) {
      const auto hit = host_.find(d.hash);  // still there: its bytes were held, so nothing pushed it out
      host_lru_.splice(host_lru_.end(), host_lru_, hit->second.lru);
    } else {
      host_adopt(d.hash, d.parent, d.tokens, p.data);
    }
    std::unique_lock<std::mutex> lk(mu_);
    count_demoted(why);
    if (p.need_disk) {
      // A block that began after others: its parent as it stands now, once the blocks before it
      // were queued (when it would have begun); nothing made queue room since.
      const bool parent_kept = p.first ? p.parent_kept : pending_.count(d.parent) || disk_.count(d.parent);
      queue_locked(d.hash, d.parent, parent_kept, d.tokens, std::move(p.data), why, lk);
    }
  }
  demoting_.clear();
}

void KvTiers::queue_locked(BlockHash hash, BlockHash parent, bool parent_kept, std::span<const int32_t> tokens,
                           std::shared_ptr<const ArenaBytes> data, Why why, std::unique_lock<std::mutex>& lk) {
  const int64_t need = data->held_bytes();
  if (why == Why::Shutdown)  // nothing waits on the engine then: wait for the writer instead
    progress_cv_.wait(lk, [&] { return queued_bytes_ + need <= queue_bound_ || (queue_.empty() && !writing_); });
  // parent_kept: the parent was queued or on disk when the demotion began; if room-making took it
  // since, this block would be an orphan.
  if (!make_queue_room_locked(need, parent) || (parent_kept && !pending_.count(parent) && !disk_.count(parent))) {
    // The writer is that far behind and nothing deeper is queued to make room: this block is not
    // written, and what descends from it (queued or written earlier) goes too.
    drop_chain_locked(hash);
    ++st_.disk_behind_dropped;
    return;
  }
  queued_bytes_ += need;
  kid_add_locked(hash, parent);
  pending_.emplace(hash, DiskJob{parent, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(data)});
  queue_.push_back(hash);
  cv_.notify_one();
}

int KvTiers::idle_room() const {
  if (cfg_.disk_dir.empty()) return INT_MAX;
  std::lock_guard<std::mutex> lk(mu_);
  if (st_.disk_writes_stopped) return INT_MAX;
  return static_cast<int>(std::clamp<int64_t>((queue_bound_ - queued_bytes_) / block_bytes_, 0, INT_MAX));
}

void KvTiers::count_deferred(int64_t blocks) {
  std::lock_guard<std::mutex> lk(mu_);
  st_.demote_deferred += blocks;
}

KvTiers::Where KvTiers::find(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const {
  auto same = [&](BlockHash p, const std::vector<int32_t>& t) {
    return p == parent && std::equal(t.begin(), t.end(), tokens.begin(), tokens.end());
  };
  if (auto it = host_.find(hash); it != host_.end() && same(it->second.parent, it->second.tokens)) return Where::Host;
  if (cfg_.disk_dir.empty()) return Where::None;
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = disk_.find(hash); it != disk_.end() && same(it->second.parent, it->second.tokens)) return Where::Disk;
  if (auto it = pending_.find(hash);
      it != pending_.end() && !it->second.cancelled && same(it->second.parent, it->second.tokens))
    return Where::Disk;
  return Where::None;
}

bool KvTiers::unpack(std::span<const uint8_t> data, bool compressed, ::ZSTD_DCtx_s* dctx, std::vector<uint8_t>& out) const {
  out.resize(static_cast<size_t>(block_bytes_));
  if (!compressed) {
    if (data.size() != out.size()) return false;
    std::memcpy(out.data(), data.data(), out.size());
    return true;
  }
  const size_t r = ZSTD_decompressDCtx(dctx, out.data(), out.size(), data.data(), data.size());
  return !ZSTD_isError(r) && r == out.size();
}

bool KvTiers::unpack_kept(const ArenaBytes& a, ::ZSTD_DCtx_s* dctx, std::vector<uint8_t>& out) const {
  out.resize(static_cast<size_t>(block_bytes_));
  if (!a.compressed()) {
    if (a.size() != block_bytes_) return false;
    a.copy_out(out);
    return true;
  }
  // Chunk by chunk through zstd's streaming interface: the chunks need not be adjacent.
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
  ZSTD_outBuffer ob{out.data(), out.size(), 0};
  size_t r = 1;
  for (int i = 0; i < a.num_pieces(); ++i) {
    const std::span<const uint8_t> p = a.piece(i);
    ZSTD_inBuffer ib{p.data(), p.size(), 0};
    while (ib.pos < ib.size) {
      const size_t in0 = ib.pos, out0 = ob.pos;
      r = ZSTD_decompressStream(dctx, &ob, &ib);
      if (ZSTD_isError(r)) return false;
      if (ib.pos == in0 && ob.pos == out0) return false;  // more input than a block: not ours
    }
  }
  return r == 0 && ob.pos == ob.size;
}

Status KvTiers::read_entry(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, ::ZSTD_DCtx_s* dctx,
                           std::vector<uint8_t>* data, bool* compressed, std::vector<uint8_t>* raw) const {
  BlockHash fh = 0, fp = 0;
  std::vector<int32_t> ft;
  SS_TRY(read_file(path_of(hash), &fh, &fp, &ft, data, compressed));
  if (fh != hash || fp != parent || !std::equal(ft.begin(), ft.end(), tokens.begin(), tokens.end()))
    return make_error("entry does not hold this block");
  if (!unpack(*data, *compressed, dctx, *raw)) return make_error("payload does not decompress");
  return {};
}

bool KvTiers::restore(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, BlockId b) {
  const Where w = find(hash, parent, tokens);
  if (w == Where::Host) {
    HostEntry& e = host_.at(hash);
    host_lru_.splice(host_lru_.end(), host_lru_, e.lru);
    const std::span<const uint8_t> in_place = e.data->compressed() ? std::span<const uint8_t>{} : e.data->contiguous();
    if (in_place.empty() && !unpack_kept(*e.data, dctx_, raw_)) return false;
    if (!be_.write_kv_block(b, in_place.empty() ? std::span<const uint8_t>(raw_) : in_place).ok()) return false;
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.restored_host;
    return true;
  }
  if (w != Where::Disk) return false;
  std::shared_ptr<const ArenaBytes> queued;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = pending_.find(hash); it != pending_.end()) queued = it->second.data;
  }
  if (queued) {  // its file is not in yet: its bytes are
    if (!unpack_kept(*queued, dctx_, raw_) || !be_.write_kv_block(b, raw_).ok()) return false;
    host_adopt(hash, parent, tokens, std::move(queued));
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.restored_disk;
    ++st_.restored_queued;
    return true;
  }
  std::vector<uint8_t> data;
  bool compressed = false;
  {
    std::lock_guard<std::mutex> lk(mu_);  // the writer never removes the file under a read
    auto it = disk_.find(hash);
    if (it == disk_.end()) return false;
    if (Status st = read_entry(hash, parent, tokens, dctx_, &data, &compressed, &raw_); !st.ok()) {
      std::fprintf(stderr, "kv disk tier: %s; deleted\n", st.message().c_str());
      disk_forget_locked(hash, true);
      return false;
    }
    disk_lru_.splice(disk_lru_.end(), disk_lru_, it->second.lru);
  }
  if (!be_.write_kv_block(b, raw_).ok()) return false;
  host_insert_copy(hash, parent, tokens, data, compressed);
  std::lock_guard<std::mutex> lk(mu_);
  ++st_.restored_disk;
  return true;
}

namespace {
// A delivered block whose bytes are a copy of its own (read from disk or decompressed), not the
// tiers' arena: counted as staging memory until taken.
bool owns_copy(const KvTiers::Loaded& l) { return l.bytes != nullptr; }
}  // namespace

uint64_t KvTiers::load_async(std::span<const LoadItem> items) {
  // Host entries and queued writes are resolved here (the host index is the engine thread's);
  // the job holds their bytes, immutable, so the loader reads them even if the host tier drops
  // the entry or the write lands meanwhile.
  std::vector<LoadJob> jobs;
  jobs.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const LoadItem& it = items[i];
    LoadJob j{0, static_cast<int>(i), it, find(it.hash, it.parent, it.tokens), nullptr, false};
    if (j.where == Where::Host) {
      j.kept = host_.at(it.hash).data;
    } else if (j.where == Where::Disk) {
      std::lock_guard<std::mutex> lk(mu_);
      if (auto p = pending_.find(it.hash); p != pending_.end()) {
        j.kept = p->second.data;
        j.queued = true;
      }
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

void KvTiers::loader_loop() {
  // A plain host entry (or queued write) is read in place: nothing to do but hand it over. A run of
  // them is handed over together, under the lock, so a returning history's host-tier blocks reach
  // the engine at once and go into the pool in one batched copy (apply_loads), not in pieces as the
  // engine wakes. Everything else (and everything while a test hook is set) is read unlocked.
  const auto in_place = [&](const LoadJob& j) {
    return j.kept && !j.kept->compressed() && static_cast<int64_t>(j.kept->contiguous().size()) == block_bytes_;
  };
  std::unique_lock<std::mutex> lk(load_mu_);
  for (;;) {
    load_cv_.wait(lk, [&] { return load_stop_ || !loads_.empty(); });
    if (load_stop_) return;
    if (!load_hook_ && in_place(loads_.front())) {
      while (!loads_.empty() && in_place(loads_.front())) {
        ready_.push_back(load_one(loads_.front()));  // no copy, no I/O: the arena's bytes, kept
        loads_.pop_front();
      }
      ready_cv_.notify_all();
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
  if (j.kept) {  // a host entry or a queued write: in the arena already
    const ArenaBytes& a = *j.kept;
    if (a.compressed() || a.contiguous().size() != static_cast<size_t>(block_bytes_)) {
      auto raw = std::make_shared<std::vector<uint8_t>>();
      if (!unpack_kept(a, loader_dctx_, *raw)) return l;
      l.bytes = std::move(raw);
    }
    if (!l.bytes || j.queued) l.kept = j.kept;  // read in place, or promoted to the host tier
    l.ok = true;
    l.from_disk = l.queued = j.queued;
    l.compressed = a.compressed();
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
  const Status s = read_entry(j.item.hash, j.item.parent, j.item.tokens, loader_dctx_, data.get(), &compressed, raw.get());
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
  const Apply a{&l, &item, b};
  std::vector<char> ok;
  apply_loads(std::span<const Apply>(&a, 1), ok);
  return ok[0] != 0;
}

void KvTiers::apply_loads(std::span<const Apply> loads, std::vector<char>& ok) {
  ok.assign(loads.size(), 0);
  copies_.clear();
  copy_of_.clear();
  for (size_t i = 0; i < loads.size(); ++i) {
    const Loaded& l = *loads[i].loaded;
    if (!l.ok) continue;
    const std::span<const uint8_t> block =
        l.bytes ? std::span<const uint8_t>(*l.bytes) : l.kept ? l.kept->contiguous() : std::span<const uint8_t>{};
    if (static_cast<int64_t>(block.size()) != block_bytes_) continue;
    copies_.push_back({loads[i].block, block});
    copy_of_.push_back(static_cast<int>(i));
  }
  if (copies_.empty()) return;
  // One call for the whole batch: the bytes stay alive (held by the loads) until it returns.
  const auto t0 = std::chrono::steady_clock::now();
  if (Status st = be_.write_kv_blocks(copies_); !st.ok()) {
    std::fprintf(stderr, "kv tiers: restore of %zu blocks failed: %s\n", copies_.size(), st.message().c_str());
    return;
  }
  const int64_t bytes = static_cast<int64_t>(copies_.size()) * block_bytes_;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bytes >= kTimedBatchBytes && s > 0) {  // smaller batches time mostly the call's fixed cost
    const double r = double(bytes) / s;
    copy_rate_ = copy_rate_ > 0 ? 0.75 * copy_rate_ + 0.25 * r : r;
  }
  int64_t from_host = 0, from_disk = 0, queued = 0;
  for (const int i : copy_of_) {
    ok[static_cast<size_t>(i)] = 1;
    const Loaded& l = *loads[static_cast<size_t>(i)].loaded;
    const LoadItem& item = *loads[static_cast<size_t>(i)].item;
    if (l.from_disk) {
      if (l.kept) host_adopt(item.hash, item.parent, item.tokens, l.kept);  // a queued write's bytes: no copy
      else if (l.stored) host_insert_copy(item.hash, item.parent, item.tokens, *l.stored, l.compressed);
    } else if (auto it = host_.find(item.hash); it != host_.end()) {
      host_lru_.splice(host_lru_.end(), host_lru_, it->second.lru);
    }
    ++(l.from_disk ? from_disk : from_host);
    if (l.queued) ++queued;
  }
  std::lock_guard<std::mutex> lk(mu_);
  st_.restored_host += from_host;
  st_.restored_disk += from_disk;
  st_.restored_queued += queued;
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
  const int64_t arena_bytes = arena_ ? arena_->bytes() : 0;
  const int64_t arena_used = arena_ ? (arena_->num_chunks() - arena_->free_chunks()) * arena_->chunk_bytes() : 0;
  std::lock_guard<std::mutex> lk(mu_);
  KvTierStats s = st_;
  s.loads_pending = pending;
  s.loads_ready = ready;
  s.load_failures = failures;
  s.staging_bytes = staging;
  s.restore_copy_bytes_per_s = copy_rate_;
  s.arena_bytes = arena_bytes;
  s.write_queue_bytes = queued_bytes_;
  s.host_capacity_bytes = cfg_.host_bytes > 0 ? arena_bytes : 0;
  s.host_used_bytes = cfg_.host_bytes > 0 ? arena_used : 0;
  s.host_blocks = static_cast<int64_t>(host_.size());
  s.disk_capacity_bytes = cfg_.disk_dir.empty() ? 0 : cfg_.disk_bytes;
  s.disk_used_bytes = disk_used_;
  s.disk_blocks = static_cast<int64_t>(disk_.size());
  return s;
}

}  // namespace ss::engine

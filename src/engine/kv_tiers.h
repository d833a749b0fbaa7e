// The KV cache's lower tiers: full blocks that leave the backend's pool (evicted for room, or idle
// longer than the TTL) are demoted here instead of dropped, and a prefix lookup that misses the
// pool restores them instead of recomputing them. Two tiers, both named by the pool's content hash
// chain (hash, parent hash and tokens are compared, as in the pool, so a collision never serves
// wrong K/V):
//   host: a byte-bounded LRU of blocks in RAM, optionally zstd-compressed, kept in an arena of
//         fixed-size chunks allocated and faulted in at start-up (kv_host_arena.h): a demotion is a
//         copy into memory already there, and the tier's bytes are the arena's, counted whole;
//   disk: one file per block in a directory, byte-bounded LRU, kept across restarts. Each file is
//         written to a temporary name, checksummed (XXH64), fsynced and renamed by a writer
//         thread; at start-up the index is rebuilt from the files, and a file that is truncated,
//         fails its checksum or belongs to another model / KV dtype / block size is deleted and
//         counted, never served. A failed write (disk full) stops disk writes; serving goes on.
// Every demotion is written through to disk (when there is a disk tier) so a crash loses at most
// the writes in flight. When the writer falls behind (the write queue at its bound) no block is
// dropped from the middle of a hash chain: idle demotions wait in the pool (idle_room), and an
// eviction makes room by dropping queued chains from their tail, the deepest blocks first; a block
// that is not written takes its queued and written descendants with it (they could never be
// found past it). A queued write holds the block's bytes in the arena (the host entry's own,
// or, without a host tier, an arena as big as the write queue's bound) and is found and restored
// from there until its file is in. Bytes are the backend's own (Backend::read_kv_blocks): restored
// K/V are bit-identical. The blocks that leave the pool together (one allocation's evictions, one
// step's TTL expiries) are demoted as one batch, their reads into plain arena chunks one batched
// read (on a GPU every block's DMA issued, then one wait). Restores are asynchronous: load_async
// hands a run of blocks to a loader thread, which reads them (disk: read and checksum; zstd:
// decompress) into staging memory while the engine steps other sequences; the engine thread then
// copies the ready blocks into the pool between steps, all of a step's in one batched copy
// (apply_loads, Backend::write_kv_blocks: on a GPU every block's DMA issued, then one wait).
// Engine-thread only, except the writer and loader threads inside.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/block_pool.h"

struct ZSTD_CCtx_s;  // zstd's contexts (zstd.h), kept across calls: a context per call allocates
struct ZSTD_DCtx_s;

namespace ss::engine {

class HostArena;
class ArenaBytes;

struct KvTierConfig {
  int64_t host_bytes = 0;      // 0: no host tier
  bool host_compress = false;  // zstd (level 1) in the host tier (and so on disk)
  int64_t ttl_ms = 30000;      // cached blocks idle this long leave the pool for the tiers (0: never)
  std::string disk_dir;        // empty: no disk tier
  int64_t disk_bytes = 0;      // the disk tier's bound (> 0 with a dir)
  int64_t disk_queue_bytes = 0;  // bytes queued for the disk writer at most (0: 256 MiB; tests set less)
  // Binds disk entries to the model: a hash of the model file (model_file_hash). Files written for
  // another model, KV dtype or block size are rejected.
  uint64_t model_hash = 0;
  bool enabled() const { return host_bytes > 0 || !disk_dir.empty(); }
  Status validate() const;
};

// XXH3-64 of a file's bytes (the model binding of disk entries).
Expected<uint64_t> model_file_hash(const std::string& path);

struct KvTierStats {
  // The host tier's arena (0 without a host tier) and the part of it in use: host entries, and
  // entries the host index let go that a queued disk write or a load still holds.
  int64_t host_capacity_bytes = 0, host_used_bytes = 0, host_blocks = 0;
  // Host memory the tiers allocated at start-up: the host tier's arena, or without a host tier the
  // disk write queue's (min(256 MiB, --kv-disk-bytes)).
  int64_t arena_bytes = 0;
  int64_t write_queue_bytes = 0;  // arena bytes held by disk writes not yet done
  int64_t disk_capacity_bytes = 0, disk_used_bytes = 0, disk_blocks = 0;
  int64_t demoted_evicted = 0;  // blocks demoted because the pool needed their room
  int64_t demoted_idle = 0;     // blocks demoted because they outlived the TTL
  int64_t restored_host = 0;    // blocks restored into the pool from each tier
  int64_t restored_disk = 0;
  int64_t restored_queued = 0;  // of restored_disk: served from the write queue, the file not yet in
  int64_t demote_no_room = 0;   // blocks dropped: every arena chunk held by queued writes or loads
  int64_t host_dropped = 0;     // host entries pushed out by its byte bound
  int64_t disk_writes = 0;      // files written
  int64_t disk_write_errors = 0;  // real I/O failures (they stop the writes), nothing else
  // The writer behind (the queue at its bound): idle demotions put off, the blocks left in the pool
  // (counted once per pass that held them back), and blocks not written or taken back off the
  // queue or the disk as the tails of chains whose earlier block could not be queued.
  int64_t demote_deferred = 0;
  int64_t disk_behind_dropped = 0;
  int64_t disk_dropped = 0;     // files removed by the byte bound
  int64_t disk_rejected = 0;    // files deleted as corrupt, truncated, partial or of another model
  bool disk_writes_stopped = false;
  int64_t loads_pending = 0;    // blocks handed to load_async, not yet taken by take_loaded
  int64_t loads_ready = 0;      // of them, loaded and waiting to be taken
  int64_t load_failures = 0;    // blocks a load could not deliver (gone, corrupt): recomputed
  int64_t staging_bytes = 0;    // loaded blocks' bytes waiting for apply_load (their own copies)
  double restore_copy_bytes_per_s = 0;  // copy_bytes_per_s()
};

class KvTiers {
 public:
  enum class Where { None, Host, Disk };  // Disk: on disk, or queued for the disk writer

  // be must outlive the tiers; its kv_block_bytes() must be > 0. Scans the disk directory.
  static Expected<std::unique_ptr<KvTiers>> create(const KvTierConfig& cfg, backend::Backend& be);
  ~KvTiers();  // finishes the queued disk writes
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;

  const KvTierConfig& config() const { return cfg_; }
  int64_t block_bytes() const { return block_bytes_; }  // the backend's kv_block_bytes()
  // The rate apply_loads' batched copies into the pool ran at (bytes a second, a moving average of
  // the batches of at least kTimedBatchBytes, timed around Backend::write_kv_blocks); 0 until one
  // was timed. The scheduler sizes a step's restores by it.
  double copy_bytes_per_s() const { return copy_rate_; }
  void set_copy_bytes_per_s(double rate) { copy_rate_ = rate; }  // tests: as if measured
  static constexpr int64_t kTimedBatchBytes = int64_t(1) << 20;
  // Why a block is demoted: the pool needed its room, it idled past the TTL, or the engine is
  // shutting down (a copy for the disk tier; not counted as a demotion).
  enum class Why { Evicted, Idle, Shutdown };
  // Copies pool block b (full, holding this content) into the tiers (a batch of one).
  void demote(BlockId b, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, Why why);
  // Copies many pool blocks into the tiers, in order, with what demote() on each in turn would do
  // (counts, host LRU order, the disk queue and its chain rules, a block with no arena room or a
  // failed read dropped alone), except that the blocks read straight into arena chunks (a plain
  // host tier, or the disk write queue's arena) are read with one Backend::read_kv_blocks call
  // (on a GPU every block's DMA issued, then one wait) instead of one call each. A batch is cut
  // (the blocks so far read and put in the tiers, then the rest go on) where its next block would
  // otherwise see a different state: its chunk needs room that only putting the earlier blocks in
  // would make (host entries to push out, queued writes to drop), or the disk queue lacks room
  // for it. Compressed (zstd) demotions are read and compressed one at a time, as before. If the
  // batched read fails, each block is read again alone, so only the failing ones are dropped.
  // One difference: a block whose read fails gives its chunk back when its batch ends, not
  // before the next block's chunk is taken (with the arena full, that next block may push out
  // one more host entry than demote() one by one would have).
  void demote(std::span<const CachedBlock> blocks, Why why);
  Where find(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const;
  // How many idle blocks may be demoted now without the disk write queue going past its bound
  // (INT_MAX without a disk tier or once writes stopped). The rest stay in the pool, findable.
  int idle_room() const;
  void count_deferred(int64_t blocks);
  // Writes the entry's K/V into pool block b, synchronously (tests; the engine uses load_async).
  // False if no tier has it, or the disk file turned out corrupt (then it is deleted and counted).
  bool restore(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, BlockId b);
  KvTierStats stats() const;
  void wait_for_writes();  // tests, shutdown: returns when the writer's queue is empty
  // Tests: runs on the writer thread before each file is written (a slow or latched disk).
  void set_write_hook(std::function<void(BlockHash)> hook);
  // Tests: the arena's address range (a demotion's bytes lie in it; nothing else is allocated).
  std::pair<const uint8_t*, const uint8_t*> arena_range() const;
  // Tests: where the host entry's bytes start (null if the host tier does not hold the block).
  const uint8_t* host_bytes_of(BlockHash hash) const;

  // Asynchronous restores. A ticket names one run of blocks; the loader delivers its items in
  // order. A block found in neither tier, or whose file fails its checks (deleted and counted), is
  // delivered with ok = false; the caller recomputes from there.
  struct LoadItem {
    BlockHash hash, parent;
    std::vector<int32_t> tokens;
  };
  struct Loaded {
    uint64_t ticket = 0;
    int index = 0;  // into the ticket's items
    bool ok = false;
    bool from_disk = false;  // from the disk tier: its file, or its write queue (queued)
    bool queued = false;
    bool compressed = false;
    // The block's K/V (ok only): a copy (read from disk or decompressed; staging memory), or else
    // the tiers' own plain bytes in the arena (kept), read in place.
    std::shared_ptr<const std::vector<uint8_t>> bytes;
    std::shared_ptr<const ArenaBytes> kept;              // also: a queued entry's bytes, to promote
    std::shared_ptr<const std::vector<uint8_t>> stored;  // from a file: the entry as stored (to promote)
  };
  uint64_t load_async(std::span<const LoadItem> items);
  // Drops the ticket's queued and delivered items; one being read is dropped when it is done.
  void cancel_load(uint64_t ticket);
  // Moves up to max delivered items into out (appended, in delivery order); returns how many.
  int take_loaded(int max, std::vector<Loaded>& out);
  // Waits up to timeout for a delivered item; true if one is there.
  bool wait_loaded(std::chrono::milliseconds timeout);
  // Copies a delivered block into pool block b (write_kv_block), promotes a disk entry to the host
  // tier and counts the restore. False if the backend refused the write.
  bool apply_load(const Loaded& l, const LoadItem& item, BlockId b);
  // The same for many delivered blocks in one batched backend copy (Backend::write_kv_blocks).
  // ok[i] (resized to loads.size()): loads[i] was copied. A load that is not ok or not a block's
  // size is left out; if the backend refuses the batch, none is copied.
  struct Apply {
    const Loaded* loaded;
    const LoadItem* item;
    BlockId block;
  };
  void apply_loads(std::span<const Apply> loads, std::vector<char>& ok);
  // Tests: runs on the loader thread before each item is read (a slow or blocked tier).
  void set_load_hook(std::function<void(BlockHash)> hook);

 private:
  struct HostEntry {
    BlockHash parent;
    std::vector<int32_t> tokens;
    std::shared_ptr<const ArenaBytes> data;  // shared with a queued disk write or a load
    std::list<BlockHash>::iterator lru;
  };
  struct DiskEntry {
    BlockHash parent;
    std::vector<int32_t> tokens;
    int64_t bytes;
    std::list<BlockHash>::iterator lru;
  };
  struct DiskJob {  // a queued write; restores are served from its bytes until the file is in
    BlockHash parent;
    std::vector<int32_t> tokens;
    std::shared_ptr<const ArenaBytes> data;
    bool cancelled = false;  // dropped while being written: the writer discards the file
  };

  KvTiers(const KvTierConfig& cfg, backend::Backend& be);
  Status scan_disk();
  void writer_loop();
  Status write_file(BlockHash hash, const DiskJob& j, int64_t* bytes);
  // Reads and checks a file; on success data holds the payload as stored.
  Status read_file(const std::string& path, BlockHash* hash, BlockHash* parent, std::vector<int32_t>* tokens,
                   std::vector<uint8_t>* data, bool* compressed) const;
  bool unpack(std::span<const uint8_t> data, bool compressed, ::ZSTD_DCtx_s* dctx, std::vector<uint8_t>& out) const;
  // The disk entry of (hash, parent, tokens), read, checked to hold that block and unpacked into
  // raw (the stored bytes in data); an error names what was wrong (the caller deletes the file).
  Status read_entry(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens, ::ZSTD_DCtx_s* dctx,
                    std::vector<uint8_t>* data, bool* compressed, std::vector<uint8_t>* raw) const;
  bool unpack_kept(const ArenaBytes& a, ::ZSTD_DCtx_s* dctx, std::vector<uint8_t>& out) const;
  std::string path_of(BlockHash h) const;
  void disk_forget_locked(BlockHash h, bool count_rejected);
  // The parent -> child links of the blocks queued or on disk (to find chains' tails).
  void kid_add_locked(BlockHash h, BlockHash parent);
  void kid_remove_locked(BlockHash h, BlockHash parent);
  bool has_queued_kid_locked(BlockHash h) const;
  // Drops h and every block queued or on disk that descends from it; counted as behind-drops.
  void drop_chain_locked(BlockHash h);
  // Drops queued chains' tails (the newest deepest block first) until need more bytes fit the
  // queue's bound; never keep_parent's chain above it. False if nothing is left to drop.
  bool make_queue_room_locked(int64_t need, BlockHash keep_parent);
  // Queues a demoted block for the writer, making room as above (a shutdown copy waits instead).
  void queue_locked(BlockHash hash, BlockHash parent, bool parent_kept, std::span<const int32_t> tokens,
                    std::shared_ptr<const ArenaBytes> data, Why why, std::unique_lock<std::mutex>& lk);
  // size bytes of arena chunks; makes room by dropping least recently used host entries no one
  // else holds. may_wait (shutdown copies): waits for the writer to let go of chunks. Null if none.
  std::shared_ptr<ArenaBytes> arena_alloc(int64_t size, bool compressed, bool may_wait);
  bool host_drop_one();
  // Pool block b's K/V into the arena (compressed with host_compress); null if no room or no read.
  std::shared_ptr<const ArenaBytes> read_block(BlockId b, bool may_wait);
  // A demotion of demote(span) whose read and what follows it wait for the batch's end (flush).
  struct PendingDemotion {
    enum Kind : uint8_t {
      Refresh,  // kept in the host tier, no disk write needed: only fresher now (counted)
      Share,    // kept in the host tier, not on disk: the write shares the host entry's bytes
      Read,     // read into data's chunk at the flush, then into the tiers
      Copied,   // read (and compressed) already: into the tiers
    } kind;
    const CachedBlock* blk;
    bool need_disk, parent_kept, first;  // first: nothing was pending when it began
    std::shared_ptr<const ArenaBytes> data;  // held: no arena_alloc pushes it out meanwhile
  };
  // The pending demotions: the Read ones' blocks in one read_kv_blocks call, then each, in order,
  // into the host tier and the disk queue (the single demote's steps after its read).
  void flush_demotions(Why why);
  void count_demoted(Why why);  // under mu_
  void host_adopt(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens,
                  std::shared_ptr<const ArenaBytes> data);
  void host_insert_copy(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens,
                        std::span<const uint8_t> stored, bool compressed);
  struct LoadJob {
    uint64_t ticket;
    int index;
    LoadItem item;
    Where where;
    std::shared_ptr<const ArenaBytes> kept;  // a host entry's or a queued write's bytes
    bool queued;
  };
  void loader_loop();
  Loaded load_one(const LoadJob& j);  // loader thread

  KvTierConfig cfg_;
  backend::Backend& be_;
  int block_size_;
  int64_t block_bytes_;
  uint32_t dtype_;
  std::shared_ptr<HostArena> arena_;  // null only without any tier memory (no host, no disk)
  // Engine-thread scratch, sized at start-up: a block, its compressed form, zstd's contexts.
  std::vector<uint8_t> raw_, packed_;
  bool registered_ = false;  // arena_ and raw_ registered with the backend (register_host_memory)
  ::ZSTD_CCtx_s* cctx_ = nullptr;
  ::ZSTD_DCtx_s* dctx_ = nullptr;
  ::ZSTD_DCtx_s* loader_dctx_ = nullptr;  // the loader thread's

  std::unordered_map<BlockHash, HostEntry> host_;
  std::list<BlockHash> host_lru_;  // front: least recently used

  mutable std::mutex mu_;  // the disk index, the write queue and the stats below
  std::condition_variable cv_, idle_cv_, progress_cv_;
  std::unordered_map<BlockHash, DiskEntry> disk_;
  std::list<BlockHash> disk_lru_;
  std::unordered_map<BlockHash, DiskJob> pending_;  // queued or being written; only the writer erases
  std::deque<BlockHash> queue_;                     // pending_'s write order, less the one being written
  std::unordered_multimap<BlockHash, BlockHash> kids_;  // parent -> child, over pending_ and disk_
  BlockHash writing_hash_ = 0;                          // pending_'s entry being written (writing_)
  int64_t queue_bound_ = 0;
  int64_t queued_bytes_ = 0;
  int64_t disk_used_ = 0;
  uint64_t writes_done_ = 0;
  bool writing_ = false, stop_ = false;
  KvTierStats st_;
  std::function<void(BlockHash)> write_hook_;
  std::thread writer_;

  // The loader: its queue, what it delivered, and the ticket it is reading now.
  mutable std::mutex load_mu_;
  std::condition_variable load_cv_, ready_cv_;
  std::deque<LoadJob> loads_;
  std::deque<Loaded> ready_;
  uint64_t next_ticket_ = 0, loading_ticket_ = 0;
  bool loading_cancelled_ = false, load_stop_ = false;
  int64_t staging_bytes_ = 0, load_failures_ = 0;
  std::function<void(BlockHash)> load_hook_;
  std::thread loader_;
  std::vector<PendingDemotion> demoting_;     // demote(span)'s batch (engine thread; capacity kept)
  std::vector<backend::KvBlockOut> reads_;    // its blocks' batched read
  std::vector<char> read_ok_;
  std::vector<backend::KvBlockIn> copies_;  // apply_loads' batch (engine thread; capacity kept)
  std::vector<int> copy_of_;
  double copy_rate_ = 0;
};

}  // namespace ss::engine

#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "tokenizer/unicode.h"

namespace ss::tok {

Status BpeModel::add_merge(std::string_view left, std::string_view right, int32_t rank) {
  auto a = vocab->find(left), b = vocab->find(right);
  std::string joined;
  joined.reserve(left.size() + right.size());
  joined.append(left).append(right);
  auto c = vocab->find(joined);
  if (a == vocab->end() || b == vocab->end() || c == vocab->end()) {
    return make_error("merge " + std::to_string(rank) + " '" + std::string(left) + " " + std::string(right) +
                      "' uses a token missing from the vocabulary");
  }
  merges_.try_emplace(key(a->second, b->second), MergeVal{rank, c->second});
  return {};
}

void BpeModel::add_merges_from_scores(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                                      const std::vector<bool>& mergeable) {
  // Rank tokens by score, highest first (ties: lower id first), as SentencePiece merges them.
  std::vector<int32_t> order(tokens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return scores[x] > scores[y]; });
  for (size_t r = 0; r < order.size(); ++r) {
    int32_t id = order[r];
    if (!mergeable[id]) continue;
    const std::string& t = tokens[id];
    for (size_t cut = utf8_len(static_cast<unsigned char>(t[0])); cut < t.size();
         cut += utf8_len(static_cast<unsigned char>(t[cut]))) {
      auto a = vocab->find(std::string_view(t).substr(0, cut));
      auto b = vocab->find(std::string_view(t).substr(cut));
      if (a == vocab->end() || b == vocab->end() || !mergeable[a->second] || !mergeable[b->second]) continue;
      merges_.try_emplace(key(a->second, b->second), MergeVal{int32_t(r), id});
    }
  }
}

void BpeModel::finish() {
  for (int b = 0; b < 256; ++b) {
    byte_char_utf8_[b].clear();
    append_utf8(byte_char_utf8_[b], uni::byte_to_cp(uint8_t(b)));
    auto it = vocab->find(byte_char_utf8_[b]);
    byte_char_id_[b] = it == vocab->end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    it = vocab->find(std::string_view(name));
    byte_token_id_[b] = it == vocab->end() ? -1 : it->second;
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (byte_level) {
      std::string mapped;
      mapped.reserve(word.size() * 2);
      for (unsigned char c : word) mapped += byte_char_utf8_[c];
      auto it = vocab->find(mapped);
      if (it != vocab->end()) {
        out.push_back(it->second);
        return;
      }
    } else {
      auto it = vocab->find(word);
      if (it != vocab->end()) {
        out.push_back(it->second);
        return;
      }
    }
  }

  struct Sym {
    int32_t id;
    int32_t prev, next;
    bool gone;
  };
  thread_local std::vector<Sym> syms;
  syms.clear();
  auto add = [&](int32_t id) {
    int32_t n = int32_t(syms.size());
    syms.push_back({id, n - 1, n + 1, false});
  };

  if (byte_level) {
    // Each byte is one symbol; a byte missing from the alphabet becomes unk or is dropped (HF).
    int32_t pending_unk = 0;  // count of pending unk symbols (fused or not)
    for (unsigned char c : word) {
      int32_t id = byte_char_id_[c];
      if (id >= 0) {
        if (pending_unk) {
          add(unk_id);
          pending_unk = 0;
        }
        add(id);
      } else if (unk_id >= 0) {
        if (pending_unk && !fuse_unk) add(unk_id);
        pending_unk = 1;
      }
    }
    if (pending_unk) add(unk_id);
  } else {
    bool pending_unk = false;
    size_t i = 0;
    while (i < word.size()) {
      size_t n = std::min<size_t>(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
      std::string_view ch = word.substr(i, n);
      i += n;
      auto it = vocab->find(ch);
      if (it != vocab->end()) {
        if (pending_unk) {
          add(unk_id);
          pending_unk = false;
        }
        add(it->second);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (unsigned char c : ch) all = all && byte_token_id_[c] >= 0;
        if (all) {
          // HF adds byte tokens without flushing a pending unk first.
          for (unsigned char c : ch) add(byte_token_id_[c]);
          continue;
        }
      }
      if (unk_id >= 0) {
        if (pending_unk && !fuse_unk) add(unk_id);
        pending_unk = true;
      }
    }
    if (pending_unk) add(unk_id);
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  if (syms.size() > 1 && !merges_.empty()) {
    struct Cand {
      int32_t rank, pos, id;
    };
    // Min-heap on (rank, pos): std heap functions keep the largest on top, so compare reversed.
    auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
    thread_local std::vector<Cand> heap;
    heap.clear();
    auto consider = [&](int32_t pos) {
      int32_t nx = syms[pos].next;
      if (nx < 0) return;
      auto it = merges_.find(key(syms[pos].id, syms[nx].id));
      if (it == merges_.end()) return;
      heap.push_back({it->second.rank, pos, it->second.id});
      std::push_heap(heap.begin(), heap.end(), worse);
    };
    for (int32_t i = 0; i + 1 < int32_t(syms.size()); ++i) consider(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      Cand top = heap.back();
      heap.pop_back();
      Sym& s = syms[top.pos];
      if (s.gone || s.next < 0) continue;
      int32_t rpos = s.next;
      Sym& r = syms[rpos];
      auto it = merges_.find(key(s.id, r.id));
      if (it == merges_.end() || it->second.id != top.id) continue;
      s.id = top.id;
      r.gone = true;
      s.next = r.next;
      if (s.next >= 0) syms[s.next].prev = top.pos;
      if (s.prev >= 0) consider(s.prev);
      consider(top.pos);
    }
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace ss::tok

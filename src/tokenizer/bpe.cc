#include "bpe.h"

#include <cstdio>
#include <cstring>
#include <queue>

#include "unicode.h"

namespace daisy::tok {

namespace {
constexpr uint64_t kEmptyKey = ~uint64_t{0};

inline uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
inline size_t MixHash(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return static_cast<size_t>(k);
}
}  // namespace

size_t StringHash::operator()(std::string_view s) const noexcept {
  // FNV-1a over 8-byte words: fast for short keys, adequate distribution with the mix.
  uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0x100000001b3ULL;
  return MixHash(h);
}

Result<std::unique_ptr<Bpe>> Bpe::FromJson(const nlohmann::json& j) {
  auto bpe = std::unique_ptr<Bpe>(new Bpe());
  if (!j.contains("vocab") || !j["vocab"].is_object()) return InvalidArgument("BPE model without a 'vocab' object");
  if (j.contains("dropout") && !j["dropout"].is_null()) {
    double d = j["dropout"].is_number() ? j["dropout"].get<double>() : -1;
    if (d != 0.0) return Unimplemented("BPE dropout " + j["dropout"].dump() + " is not supported (it is random)");
  }
  auto str_or_empty = [&](const char* key) -> std::string {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto flag = [&](const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  bpe->continuing_subword_prefix_ = str_or_empty("continuing_subword_prefix");
  bpe->end_of_word_suffix_ = str_or_empty("end_of_word_suffix");
  if (j.contains("unk_token") && j["unk_token"].is_string()) bpe->unk_token_ = j["unk_token"].get<std::string>();
  bpe->fuse_unk_ = flag("fuse_unk");
  bpe->byte_fallback_ = flag("byte_fallback");
  bpe->ignore_merges_ = flag("ignore_merges");

  const auto& vocab = j["vocab"];
  bpe->vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) return InvalidArgument("vocab entry '" + it.key() + "' has no integer id");
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > kMaxTokenId) return InvalidArgument("vocab id out of range for '" + it.key() + "'");
    bpe->vocab_[it.key()] = static_cast<int32_t>(id);
    if (id > max_id) max_id = static_cast<int32_t>(id);
  }
  bpe->id_to_token_.assign(static_cast<size_t>(max_id) + 1, std::string());
  for (const auto& [tok, id] : bpe->vocab_) bpe->id_to_token_[static_cast<size_t>(id)] = tok;
  for (int b = 0; b < 256; ++b) {
    char code[8];
    std::snprintf(code, sizeof(code), "<0x%02X>", b);
    auto it = bpe->vocab_.find(std::string_view(code));
    bpe->byte_ids_[b] = it == bpe->vocab_.end() ? -1 : it->second;
  }

  // Merges: "a b" strings or ["a", "b"] pairs; rank = position. A repeated pair keeps the
  // later rank, as the Rust HashMap collect does.
  size_t n_merges = j.contains("merges") && j["merges"].is_array() ? j["merges"].size() : 0;
  size_t cap = 16;
  while (cap < n_merges * 2 + 16) cap <<= 1;
  bpe->merge_keys_.assign(cap, kEmptyKey);
  bpe->merge_values_.assign(cap, MergeValue{0, 0});
  bpe->merge_mask_ = cap - 1;
  const size_t prefix_len = bpe->continuing_subword_prefix_.size();
  std::string a, b;
  for (size_t rank = 0; rank < n_merges; ++rank) {
    const auto& m = j["merges"][rank];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos)
        return InvalidArgument("merge " + std::to_string(rank + 1) + " '" + s + "' has no space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return InvalidArgument("merge " + std::to_string(rank + 1) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto ia = bpe->vocab_.find(a);
    auto ib = bpe->vocab_.find(b);
    if (ia == bpe->vocab_.end()) return InvalidArgument("merge token '" + a + "' is not in the vocabulary");
    if (ib == bpe->vocab_.end()) return InvalidArgument("merge token '" + b + "' is not in the vocabulary");
    std::string merged = a + (b.size() >= prefix_len ? b.substr(prefix_len) : std::string());
    auto in = bpe->vocab_.find(merged);
    if (in == bpe->vocab_.end()) return InvalidArgument("merge result '" + merged + "' is not in the vocabulary");
    uint64_t key = PairKey(ia->second, ib->second);
    size_t slot = MixHash(key) & bpe->merge_mask_;
    while (bpe->merge_keys_[slot] != kEmptyKey && bpe->merge_keys_[slot] != key) slot = (slot + 1) & bpe->merge_mask_;
    bpe->merge_keys_[slot] = key;
    bpe->merge_values_[slot] = MergeValue{static_cast<uint32_t>(rank), in->second};
  }
  // An unk_token missing from the vocabulary is reported when an unknown character is met,
  // as the Rust library does, rather than refusing a file it accepts.
  return bpe;
}

const Bpe::MergeValue* Bpe::FindMerge(int32_t a, int32_t b) const {
  uint64_t key = PairKey(a, b);
  size_t slot = MixHash(key) & merge_mask_;
  while (true) {
    uint64_t k = merge_keys_[slot];
    if (k == key) return &merge_values_[slot];
    if (k == kEmptyKey) return nullptr;
    slot = (slot + 1) & merge_mask_;
  }
}

const std::string& Bpe::IdToToken(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return kEmpty;
  return id_to_token_[static_cast<size_t>(id)];
}

std::optional<int32_t> Bpe::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

Status Bpe::Tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return Status::Ok();
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return Status::Ok();
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return Status::Ok();
    }
  }
  std::vector<int32_t> ids;
  DAISY_RETURN_IF_ERROR(MergeWord(word, ids));
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() < kCacheMaxLength) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
  return Status::Ok();
}

Status Bpe::MergeWord(std::string_view w, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t c;
    int32_t prev;
    int32_t next;
    uint32_t len;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&](int32_t c, uint32_t len) {
    int32_t n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({c, n - 1, -1, len});
  };
  int32_t unk_id = -1;  // a pending unk (fused with the following unknown characters)
  uint32_t unk_len = 0;
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t start = i;
    size_t end = i + Utf8Len(static_cast<unsigned char>(w[i]));
    bool is_first = start == 0;
    bool is_last = end >= w.size();
    uint32_t byte_len = static_cast<uint32_t>(end - start);
    s.assign(w.substr(start, end - start));
    if (!is_first && !continuing_subword_prefix_.empty()) s.insert(0, continuing_subword_prefix_);
    if (is_last && !end_of_word_suffix_.empty()) s.append(end_of_word_suffix_);
    i = end;
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(it->second, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_ids_[c] >= 0;
      if (all) {
        // As in the Rust library, a pending unk is not flushed before byte tokens.
        for (unsigned char c : s) add(byte_ids_[c], 1);
        continue;
      }
    }
    if (unk_token_) {
      auto uit = vocab_.find(*unk_token_);
      if (uit == vocab_.end()) {
        return InvalidArgument("BPE unk_token '" + *unk_token_ + "' is not in the vocabulary");
      }
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = uit->second;
        unk_len = byte_len;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  // merge_all: lowest rank first, ties to the leftmost position.
  struct Merge {
    int32_t pos;
    uint32_t rank;
    int32_t new_id;
  };
  struct Lower {
    bool operator()(const Merge& a, const Merge& b) const { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; }
  };
  std::vector<Merge> storage;
  storage.reserve(symbols.size() * 2);
  std::priority_queue<Merge, std::vector<Merge>, Lower> queue(Lower{}, std::move(storage));
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const MergeValue* m = FindMerge(symbols[k].c, symbols[k + 1].c)) {
      queue.push({static_cast<int32_t>(k), m->rank, m->new_id});
    }
  }
  while (!queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    size_t next_pos = static_cast<size_t>(cur.next);
    Symbol right = symbols[next_pos];
    const MergeValue* m = FindMerge(cur.c, right.c);
    if (!m || m->new_id != top.new_id) continue;
    // merge_with
    cur.c = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next > -1 && static_cast<size_t>(right.next) < symbols.size()) {
      symbols[static_cast<size_t>(right.next)].prev = top.pos;
    }
    if (cur.prev >= 0) {
      const Symbol& prev = symbols[static_cast<size_t>(cur.prev)];
      if (const MergeValue* pm = FindMerge(prev.c, cur.c)) queue.push({cur.prev, pm->rank, pm->new_id});
    }
    if (cur.next >= 0 && static_cast<size_t>(cur.next) < symbols.size()) {
      const Symbol& nx = symbols[static_cast<size_t>(cur.next)];
      if (const MergeValue* nm = FindMerge(cur.c, nx.c)) queue.push({top.pos, nm->rank, nm->new_id});
    }
  }
  for (const Symbol& sym : symbols) {
    if (sym.len != 0) out.push_back(sym.c);
  }
  return Status::Ok();
}

}  // namespace daisy::tok

// The BPE model of tokenizers/src/models/bpe: vocabulary, merges ranked by position,
// merge_all with a priority queue (lowest rank first, then leftmost), byte_fallback,
// fuse_unk, unk_token, continuing_subword_prefix, end_of_word_suffix, ignore_merges, and a
// bounded word cache. Thread-safe: the cache is guarded by a mutex.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "daisy/status.h"

namespace daisy::tok {

// Ids above this are refused (the largest real vocabularies hold about 262k tokens); it keeps
// a malformed file from asking for a huge id table.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // j is tokenizer.json's "model" object with type "BPE".
  static Result<std::unique_ptr<Bpe>> FromJson(const nlohmann::json& j);

  // Appends the ids of one pre-tokenized word.
  Status Tokenize(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab() const { return vocab_; }
  // "" when id is not in the vocabulary.
  const std::string& IdToToken(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct MergeValue {
    uint32_t rank;
    int32_t new_id;
  };
  Status MergeWord(std::string_view w, std::vector<int32_t>& out) const;
  const MergeValue* FindMerge(int32_t a, int32_t b) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  // Open-addressing table keyed by (a, b).
  std::vector<uint64_t> merge_keys_;
  std::vector<MergeValue> merge_values_;
  size_t merge_mask_ = 0;

  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> ids, -1 when absent

  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxLength = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace daisy::tok

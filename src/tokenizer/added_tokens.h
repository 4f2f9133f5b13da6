// Added tokens (tokenizers/src/tokenizer/added_vocabulary.rs): matched leftmost-longest in
// the raw text (normalized: false) or in each normalized piece (normalized: true), with
// single_word, lstrip and rstrip as the Rust library applies them. Immutable; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pipeline.h"

namespace daisy::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A byte trie over token contents giving the longest token that starts at a position.
class TokenTrie {
 public:
  void Add(std::string_view s, int32_t index);
  bool empty() const { return nodes_.size() <= 1; }
  // False when no entry starts with byte b (a cheap filter before LongestAt).
  bool MayStartWith(unsigned char b) const { return first_bytes_[b]; }
  // Index of the longest entry that is a prefix of text[pos..], -1 if none; *len its length.
  int32_t LongestAt(std::string_view text, size_t pos, size_t* len) const;

 private:
  struct Node {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t index = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_bytes_{};
};

class AddedVocabulary {
 public:
  // `normalizer` (may be null) normalizes the contents of normalized tokens for matching.
  Status Init(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits the input into pieces: added tokens (token >= 0) and normalized text pieces.
  Status ExtractAndNormalize(std::string_view text, const Normalizer* normalizer, Pieces& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* ById(int32_t id) const;
  const AddedToken* ByContent(std::string_view content) const;

 private:
  struct Match {
    int32_t token;  // -1 for text
    size_t start, end;
  };
  void FindMatches(std::string_view s, const TokenTrie& trie, const std::vector<int32_t>& ids,
                   std::vector<Match>& out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  TokenTrie raw_trie_, norm_trie_;
  std::vector<int32_t> raw_ids_, norm_ids_;  // trie entry -> index into tokens_
};

}  // namespace daisy::tok

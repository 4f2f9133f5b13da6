#include "added_tokens.h"

#include <algorithm>

#include "unicode.h"

namespace daisy::tok {

void TokenTrie::Add(std::string_view s, int32_t index) {
  if (!s.empty()) first_bytes_[static_cast<unsigned char>(s[0])] = true;
  int32_t node = 0;
  for (unsigned char c : s) {
    auto it = nodes_[static_cast<size_t>(node)].next.find(c);
    if (it == nodes_[static_cast<size_t>(node)].next.end()) {
      int32_t n = static_cast<int32_t>(nodes_.size());
      nodes_[static_cast<size_t>(node)].next.emplace(c, n);
      nodes_.emplace_back();
      node = n;
    } else {
      node = it->second;
    }
  }
  // The first pattern with given content wins (aho-corasick keeps the lowest pattern id).
  if (nodes_[static_cast<size_t>(node)].index < 0) nodes_[static_cast<size_t>(node)].index = index;
}

int32_t TokenTrie::LongestAt(std::string_view text, size_t pos, size_t* len) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& next = nodes_[static_cast<size_t>(node)].next;
    auto it = next.find(static_cast<unsigned char>(text[i]));
    if (it == next.end()) break;
    node = it->second;
    if (nodes_[static_cast<size_t>(node)].index >= 0) {
      best = nodes_[static_cast<size_t>(node)].index;
      *len = i + 1 - pos;
    }
  }
  return best;
}

Status AddedVocabulary::Init(std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  tokens_ = std::move(tokens);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_id_.emplace(tokens_[i].id, i);
    by_content_.emplace(tokens_[i].content, i);
  }
  // Special tokens first, then the others, as refresh_added_tokens chains them; empty
  // contents can never match.
  std::vector<size_t> order;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].special) order.push_back(i);
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!tokens_[i].special) order.push_back(i);
  }
  for (size_t i : order) {
    const AddedToken& t = tokens_[i];
    if (t.normalized) {
      Piece p{t.content, true, -1};
      if (normalizer) DAISY_RETURN_IF_ERROR(normalizer->Normalize(p));
      if (p.text.empty()) continue;
      norm_trie_.Add(p.text, static_cast<int32_t>(norm_ids_.size()));
      norm_ids_.push_back(static_cast<int32_t>(i));
    } else {
      if (t.content.empty()) continue;
      raw_trie_.Add(t.content, static_cast<int32_t>(raw_ids_.size()));
      raw_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  return Status::Ok();
}

const AddedToken* AddedVocabulary::ById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::ByContent(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

namespace {

// Byte offset where the trailing run of whitespace of s begins (s.size() if none).
size_t SpaceLeftmostAtEnd(std::string_view s) {
  size_t leftmost = s.size();
  size_t i = s.size();
  while (i > 0) {
    size_t k = i - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t j = k;
    if (!IsWhitespace(NextCodePoint(s, j))) break;
    leftmost = k;
    i = k;
  }
  return leftmost;
}

// Byte length of the leading run of whitespace of s.
size_t SpaceRightmostAtStart(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!IsWhitespace(NextCodePoint(s, j))) break;
    i = j;
  }
  return i;
}

bool EndsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return IsWordChar(NextCodePoint(s, k));
}

bool StartsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return IsWordChar(NextCodePoint(s, i));
}

}  // namespace

void AddedVocabulary::FindMatches(std::string_view s, const TokenTrie& trie, const std::vector<int32_t>& ids,
                                  std::vector<Match>& out) const {
  out.clear();
  if (s.empty()) return;
  size_t start_offset = 0;
  // Leftmost-longest, non-overlapping matches over the text (aho-corasick find_iter).
  size_t pos = 0;
  while (pos < s.size()) {
    if (!trie.MayStartWith(static_cast<unsigned char>(s[pos]))) {
      ++pos;
      continue;
    }
    size_t len = 0;
    int32_t e = trie.LongestAt(s, pos, &len);
    if (e < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;
    const AddedToken& t = tokens_[static_cast<size_t>(ids[static_cast<size_t>(e)])];
    if (t.single_word) {
      bool start_space = start == 0 || !EndsWithWord(s.substr(0, start));
      bool stop_space = stop == s.size() || !StartsWithWord(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(SpaceLeftmostAtEnd(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += SpaceRightmostAtStart(s.substr(stop));
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({t.id, start, stop});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({-1, start_offset, s.size()});
}

Status AddedVocabulary::ExtractAndNormalize(std::string_view text, const Normalizer* normalizer, Pieces& out) const {
  out.clear();
  std::vector<Match> matches;
  // 1. Tokens that match the raw text.
  Pieces first;
  if (raw_trie_.empty()) {
    if (!text.empty()) first.push_back(Piece{std::string(text), true, -1});
  } else {
    FindMatches(text, raw_trie_, raw_ids_, matches);
    for (const auto& m : matches) {
      if (m.end <= m.start) continue;
      first.push_back(Piece{std::string(text.substr(m.start, m.end - m.start)), m.start == 0, m.token});
    }
  }
  // 2. Normalize the other pieces, then match the normalized tokens in them.
  for (auto& p : first) {
    if (p.token >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    if (normalizer) DAISY_RETURN_IF_ERROR(normalizer->Normalize(p));
    if (norm_trie_.empty()) {
      if (!p.text.empty()) out.push_back(std::move(p));
      continue;
    }
    FindMatches(p.text, norm_trie_, norm_ids_, matches);
    for (const auto& m : matches) {
      if (m.end <= m.start) continue;
      out.push_back(Piece{p.text.substr(m.start, m.end - m.start), p.at_origin && m.start == 0, m.token});
    }
  }
  return Status::Ok();
}

}  // namespace daisy::tok

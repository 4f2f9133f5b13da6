// Patterns and NormalizedString::split behaviours.
#include <algorithm>
#include <utility>

#include "pipeline.h"

namespace daisy::tok {

Result<SplitBehavior> ParseSplitBehavior(const nlohmann::json& j) {
  if (!j.is_string()) return InvalidArgument("split behavior must be a string");
  const std::string& s = j.get_ref<const std::string&>();
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  return Unimplemented("split behavior '" + s + "' is not supported");
}

Result<std::unique_ptr<Pattern>> Pattern::FromJson(const nlohmann::json& j) {
  if (j.is_string()) return Literal(j.get<std::string>());  // a bare string is a literal
  if (!j.is_object()) return InvalidArgument("pattern must be {\"String\": ..} or {\"Regex\": ..}");
  auto p = std::make_unique<Pattern>();
  if (j.contains("String") && j["String"].is_string()) {
    p->literal_ = j["String"].get<std::string>();
    return p;
  }
  if (j.contains("Regex") && j["Regex"].is_string()) {
    DAISY_ASSIGN_OR_RETURN(p->regex_, Regex::Compile(j["Regex"].get<std::string>()));
    return p;
  }
  return Unimplemented("pattern " + j.dump() + " is not supported (expected String or Regex)");
}

std::unique_ptr<Pattern> Pattern::Literal(std::string s) {
  auto p = std::make_unique<Pattern>();
  p->literal_ = std::move(s);
  return p;
}

Status Pattern::FindMatches(std::string_view text, std::vector<MatchSpan>& out) const {
  out.clear();
  if (text.empty()) {
    out.push_back({0, 0, false});
    return Status::Ok();
  }
  size_t prev = 0;
  auto add = [&](size_t s, size_t e) {
    if (prev != s) out.push_back({prev, s, false});
    out.push_back({s, e, true});
    prev = e;
  };
  if (regex_) {
    std::vector<Span> spans;
    DAISY_RETURN_IF_ERROR(regex_->FindAll(text, spans));
    for (auto [s, e] : spans) add(s, e);
  } else if (!literal_.empty()) {
    size_t pos = 0;
    while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
      add(pos, pos + literal_.size());
      pos += literal_.size();
    }
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
  return Status::Ok();
}

Status Pattern::ReplaceAll(std::string& text, std::string_view content) const {
  if (!regex_ && (literal_.empty() || text.find(literal_) == std::string::npos)) return Status::Ok();
  std::vector<MatchSpan> spans;
  DAISY_RETURN_IF_ERROR(FindMatches(text, spans));
  std::string out;
  out.reserve(text.size());
  for (const auto& m : spans) {
    if (m.is_match) {
      out.append(content);
    } else {
      out.append(text, m.start, m.end - m.start);
    }
  }
  text = std::move(out);
  return Status::Ok();
}

void SplitByMatches(const Piece& piece, const std::vector<MatchSpan>& matches, SplitBehavior behavior, Pieces& out) {
  struct Part {
    size_t start, end;
    bool remove;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size());
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& m : matches) parts.push_back({m.start, m.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (const auto& m : matches) parts.push_back({m.start, m.end, m.is_match});
      break;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& m : matches) {
        if (m.is_match == previous_match && !parts.empty()) {
          parts.back().end = m.end;
        } else {
          parts.push_back({m.start, m.end, false});
        }
        previous_match = m.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& m : matches) {
        if (m.is_match && !previous_match && !parts.empty()) {
          parts.back().end = m.end;
        } else {
          parts.push_back({m.start, m.end, false});
        }
        previous_match = m.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous_match && !parts.empty()) {
          parts.back().start = it->start;
        } else {
          parts.push_back({it->start, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
  }
  for (const auto& p : parts) {
    if (p.remove || p.end == p.start) continue;
    Piece np;
    np.text.assign(piece.text, p.start, p.end - p.start);
    np.at_origin = piece.at_origin && p.start == 0;
    out.push_back(std::move(np));
  }
}

}  // namespace daisy::tok

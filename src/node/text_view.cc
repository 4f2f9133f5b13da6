// A device's terminal view of the room's turns (text_view.h).
#include "text_view.h"

#include <algorithm>

namespace daisy::node {

namespace {
// Streams shown at once at most: heads whose turns overlap (each on its own devices). A
// stream that never ends (its head died) makes room for new ones.
constexpr size_t kMaxStreams = 4;
// What a stream keeps for a retract, at most (a turn's text is far smaller); and how far
// ahead of the tokens shown a piece may claim to be.
constexpr size_t kMaxKeptBytes = 4u << 20;
constexpr size_t kMaxTokenGap = 64;
}  // namespace

TextView::Stream* TextView::Find(const std::string& key, uint32_t id) {
  for (auto& s : streams_)
    if (s.key == key && s.id == id) return &s;
  return nullptr;
}

void TextView::BreakLine() {
  if (!at_line_start_) write_("\n");
  at_line_start_ = true;
}

void TextView::Show(Stream& s, std::string_view bytes) {
  if (bytes.empty()) return;
  if (last_key_ != s.key || last_id_ != s.id) {
    BreakLine();
    write_("--- " + s.head + " (continued) ---\n");
    last_key_ = s.key;
    last_id_ = s.id;
  }
  write_(bytes);
  at_line_start_ = bytes.back() == '\n';
}

void TextView::On(const std::string& head_key, const std::string& head, const wire::Text& t) {
  Stream* s = Find(head_key, t.stream);
  if (t.kind == wire::TextKind::kBegin) {
    if (s) return;  // said twice: once is enough
    if (streams_.size() >= kMaxStreams) streams_.erase(streams_.begin());
    streams_.push_back(Stream{head_key, t.stream, head, "", {}});
    BreakLine();
    write_("--- text of a turn by " + head + " ---\n");
    last_key_ = head_key;
    last_id_ = t.stream;
    return;
  }
  if (!s) return;  // a stream begun before this device was listening: its text is partial
  switch (t.kind) {
    case wire::TextKind::kPiece:
      // Pieces of one token share its index; a new index starts a token (a gap: tokens lost
      // on the way start here too).
      if (static_cast<size_t>(t.index) > s->starts.size() + kMaxTokenGap) break;
      while (s->starts.size() <= static_cast<size_t>(t.index)) s->starts.push_back(s->text.size());
      if (s->text.size() < kMaxKeptBytes) s->text += t.text;
      Show(*s, t.text);
      break;
    case wire::TextKind::kRetract: {
      if (static_cast<size_t>(t.index) >= s->starts.size()) break;
      s->text.resize(s->starts[static_cast<size_t>(t.index)]);
      s->starts.resize(static_cast<size_t>(t.index));
      BreakLine();
      write_("--- the audit withdrew the text after token " + std::to_string(t.index) + " of " + s->head +
             "'s turn; it goes on from there ---\n");
      last_key_ = s->key;
      last_id_ = s->id;
      Show(*s, s->text);
      break;
    }
    case wire::TextKind::kEnd:
    case wire::TextKind::kFailed: {
      if (t.kind == wire::TextKind::kEnd) {
        s->text += t.text;
        Show(*s, t.text);
      }
      BreakLine();
      write_(t.kind == wire::TextKind::kEnd
                 ? "--- end of the turn by " + s->head + " (" + std::to_string(t.index) + " tokens) ---\n"
                 : "--- the turn by " + s->head + " failed after " + std::to_string(t.index) + " tokens ---\n");
      last_key_.clear();
      streams_.erase(streams_.begin() + (s - streams_.data()));
      break;
    }
    case wire::TextKind::kBegin:
      break;
  }
}

}  // namespace daisy::node

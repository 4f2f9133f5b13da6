// How a device's terminal shows the room's turns as they are generated (wire::Text from the
// heads): a header line naming the head, the text as it streams, a closing line. The text
// never shares a line with a log line: BreakLine ends an open line first. Internal to the
// node module; not thread-safe (the node's thread owns it).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "daisy/wire.h"

namespace daisy::node {

class TextView {
 public:
  // `write` puts bytes on the terminal (the node: stdout, flushed).
  explicit TextView(std::function<void(std::string_view)> write) : write_(std::move(write)) {}

  // A message of the stream `t.stream` of the head whose key is `head_key`, shown as `head`.
  void On(const std::string& head_key, const std::string& head, const wire::Text& t);
  // Before a log line: ends the line of text in progress, so the log line starts a line.
  void BreakLine();

 private:
  struct Stream {
    std::string key;
    uint32_t id = 0;
    std::string head;
    std::string text;            // what it has shown, for a retract
    std::vector<size_t> starts;  // where each token's text starts in `text`
  };
  Stream* Find(const std::string& key, uint32_t id);
  void Show(Stream& s, std::string_view bytes);  // with a header when another stream wrote last

  std::function<void(std::string_view)> write_;
  std::vector<Stream> streams_;  // the open ones, oldest first (a few at most)
  std::string last_key_;         // whose text is on the current line: its head's key and stream
  uint32_t last_id_ = 0;
  bool at_line_start_ = true;
};

}  // namespace daisy::node

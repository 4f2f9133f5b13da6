// A turn's text as its client sees it (TurnText). Internal to src/server: no model, no
// ring, so it is tested on its own (turn_text_test.cc).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api.h"

namespace daisy::srv {

// The text of one turn as its client sees it: the head's text of each token (the head
// detokenizes, once: TurnRequest::on_token) through the turn's stop strings. Not
// thread-safe.
class TurnText {
 public:
  explicit TurnText(std::vector<std::string> stops) : stops_(stops), matcher_(std::move(stops)) {}
  // The head's text of the next token; returns what may be shown now, or nullopt when a
  // stop string already ended the text (the token is not counted).
  std::optional<std::string> Add(std::string_view piece);
  // Text the head held back to the end (token id -1): shown by Finish.
  void HoldBack(std::string_view text);
  // An audit withdrew the tokens after the first `kept`: returns the text of those.
  std::string Retract(size_t kept);
  // What is left to show at the end ("" after a stop string).
  std::string Finish();
  bool stopped() const { return matcher_.stopped(); }
  const std::string& text() const { return matcher_.text(); }  // all shown so far
  int tokens() const { return static_cast<int>(pieces_.size()); }

 private:
  std::vector<std::string> stops_;
  StopMatcher matcher_;
  std::vector<std::string> pieces_;  // of each token counted
  std::string held_back_;
};

}  // namespace daisy::srv

// Runs the turns of serve's requests on the head: each waits for its ticket in the line of
// turns (its position reported as it changes; it leaves the line when its client does),
// then runs on the ring with stop strings and JSON mode made fresh for every run of the
// turn, its text streamed as it comes; a model load is a turn too. Internal to src/server;
// thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "api.h"
#include "daisy/generator.h"
#include "daisy/head.h"
#include "daisy/status.h"
#include "daisy/tokenizer.h"
#include "daisy/turn_queue.h"
#include "turn_text.h"

namespace daisy::srv {

class EventHub;
class ModelExtras;

// What a request asks of its turn, tokenized before it waits.
struct TurnSpec {
  std::vector<int32_t> prompt_ids;
  std::shared_ptr<const Tokenizer> tokenizer;  // the one that made prompt_ids
  GenerateOptions generate;
  int ctx = 0;  // > 0: the context this turn wants (reloads the model when it differs)
  bool verify = false;
  bool json = false;
  std::optional<int> stages;
  std::string conversation;  // the prefix-cache key
  std::vector<std::string> stops;
};

// What the request hears of its turn; every hook may be empty.
struct TurnHooks {
  std::function<void(int)> on_queued;  // turns ahead of this one, when it changes
  std::function<void()> on_started;
  // Text that may be shown now (possibly empty) for token `id`; id -1: the last text.
  std::function<void(int32_t id, const std::string& text)> on_text;
  std::function<void(const std::string& line)> on_status;
  std::function<void(const StageProgress&)> on_progress;
  // An audit withdrew tokens: only the first `kept` stand, and `text` is all shown now.
  std::function<void(size_t kept, const std::string& text)> on_retract;
  std::function<bool()> alive;  // false once the client is gone
};

struct TurnOutcome {
  Status status;
  bool cancelled = false;  // left the queue (client gone or stopping)
  HeadReport report;
  std::string text;           // as shown (stop strings cut)
  std::string finish_reason;  // "stop" | "length"
  int completion_tokens = 0;
};

// The loaded model and its tokenizer.
struct LoadedModel {
  ModelView model;
  std::shared_ptr<const Tokenizer> tokenizer;
};

class TurnRunner {
 public:
  // Turns wait in the session's own line (HeadSession::turns()) and run in the ticket they
  // hold there; `on_change` is called when the line or the model changed (the state
  // snapshot is recomputed). Status lines and progress go to `hub` too.
  TurnRunner(HeadSession& session, ModelExtras& extras, EventHub& hub, std::function<void()> on_change);

  TurnOutcome Run(const TurnSpec& spec, const TurnHooks& hooks);
  // Loads SRC as the session's model, in a turn of its own, and reads its extras.
  Result<ModelView> Load(const std::string& source, int ctx);

  // The loaded model and tokenizer, or the 503 answer.
  std::variant<LoadedModel, ApiError> Loaded() const;

  // The split a turn uses when its request names none (POST /api/load "stages", serve
  // --stages); 0: automatic (the head alone when it can hold the model).
  int default_stages() const { return default_stages_.load(); }
  void set_default_stages(int n) { default_stages_.store(std::max(0, n)); }
  std::optional<int> DefaultStages() const;

  bool busy() const { return turns_.busy(); }
  size_t waiting() const { return turns_.waiting(); }

  // Waiting requests leave the line, running turns stop at their next token.
  void Stop();

 private:
  // Waits for the ring: false when alive() turns false (the client left) or on Stop.
  bool Enter(TurnQueue::Ticket& ticket, const std::function<void(int)>& on_position,
             const std::function<bool()>& alive);

  HeadSession& session_;
  TurnQueue& turns_;
  ModelExtras& extras_;
  EventHub& hub_;
  const std::function<void()> on_change_;
  std::atomic<int> default_stages_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace daisy::srv

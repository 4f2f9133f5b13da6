// The generation loop on the head: prompt ids -> prefill (at once or in chunks) -> decode
// one token per step with SampleToken -> stop on a stop id ("stop") or when max_tokens or
// the context is reached ("length"). Works through a HeadStage, so the same loop drives a
// single device, an in-process split or the ring. With lookahead drafting, a lap also scores
// the tokens that followed an earlier occurrence of the text's suffix; the ids are those of
// a run without it. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "daisy/forward.h"
#include "daisy/sampling.h"
#include "daisy/status.h"

namespace daisy {

struct GenerateOptions {
  int max_tokens = 60;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // spec.eos_ids plus the user's; a stop id ends the turn
  int prefill_chunk = 0;          // prompt positions per forward step; 0 = the whole prompt
  int prefill_in_flight = 1;      // chunks in the rest of the ring at once (a ring overlaps them)
  // Prefix reuse: positions [0, first_position) of the prompt are already in the head's KV
  // cache (and every stage's); the prefill starts there. Must be < prompt size.
  int first_position = 0;
  // Optional, before each token is sampled: may lower logits to -inf, never raise them
  // (JSON mode). tokens_left counts this token.
  std::function<void(std::span<float> logits, int tokens_left)> constrain;
  // Optional, at every step before `constrain` and sampling, including a step whose token is
  // a stop id: the position of the token it chooses, the final hidden row it was read out
  // from, and its logits as the model computed them. Verify digests these to compare bits.
  std::function<void(int position, std::span<const float> hidden_row, std::span<const float> logits)> on_step;
  // Optional, after each token is emitted: true ends the turn with finish reason "stop"
  // (a completed JSON value, a stop string, a client that went away).
  std::function<bool(int32_t id)> stop_after;
  // Lookahead drafting (prompt lookup): up to this many drafted tokens ride along with each
  // decode lap and are kept while they equal what is sampled; 0 = off. Changes no id.
  int lookahead = 0;
};

// What the command line turns on unless --no-lookahead: drafts per lap at most.
inline constexpr int kDefaultLookahead = 8;

// The draft for the sequence so far: the tokens that followed the most recent earlier
// occurrence of its longest suffix of 2..4 ids (at most max_draft of them); empty when the
// suffix never occurred before. Pure.
std::vector<int32_t> LookupDraft(std::span<const int32_t> seq, int max_draft);

enum class FinishReason : uint8_t { kStop, kLength };
std::string_view FinishReasonName(FinishReason reason);  // "stop" | "length"

struct GenerateResult {
  std::vector<int32_t> ids;  // generated ids; a stop id is not included
  FinishReason finish_reason = FinishReason::kLength;
  std::optional<int32_t> stop_id;  // the id that stopped it (finish_reason kStop)
  int prefill_tokens = 0;
  double prefill_seconds = 0;
  int decode_steps = 0;  // generated tokens fed back (in the cache); one forward step each without drafts
  double decode_seconds = 0;
  int decode_laps = 0;  // forward steps after the prefill (each one lap of the ring)
  int drafted = 0;      // drafted tokens scored
  int accepted = 0;     // drafted tokens kept (equal to what was sampled)
  int rolled_back = 0;  // positions of the last lap's drafts forgotten at the end (the turn stopped before them)
};

// Sees each generated token as it is chosen, with the logits it was sampled from.
using TokenCallback = std::function<void(int32_t id, std::span<const float> logits)>;

class Generator {
 public:
  explicit Generator(HeadStage& head) : head_(head) {}
  // Runs one turn from position 0. The prompt must be non-empty and fit in the context.
  Result<GenerateResult> Generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                  const TokenCallback& on_token = {});

 private:
  HeadStage& head_;
};

}  // namespace daisy

// Token sampling as pure functions (STYLE.md item 10): logits come in as a const span and
// the random number is drawn from a counter-based generator keyed by (seed, position), so
// the token chosen at a position depends on nothing else: a replay of a turn (after a
// fault, or on another device) gives the same tokens, whatever happened before.
// Every step is deterministic: the softmax uses detmath::Exp and sums in a fixed order,
// sorting uses a total order (logit descending, then id ascending), so the result is the
// same bits on every machine. Functions are thread-safe; the types are value types.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "daisy/status.h"

namespace daisy {

struct SamplingParams {
  float temperature = 0;  // 0 (or below): greedy argmax
  int top_k = 0;          // keep the k most likely tokens; 0 = off
  float top_p = 1.0f;     // keep the smallest prefix whose probability reaches top_p; 1 = off
  uint64_t seed = 1234;
};

// Refuses values a user may type but SampleToken would only reinterpret: a negative or
// non-finite temperature, a negative top_k, a top_p outside (0, 1]. The message names the
// field and the value.
Status ValidateSamplingParams(const SamplingParams& params);

// The draw for `position`: SplitMix64-style mixing of (seed, position) to 64 bits, of which
// the top 24 make a float k * 2^-24 in [0, 1). Exact on every machine.
float UniformDraw(uint64_t seed, int64_t position);

// The greedy choice: the largest logit, the lowest id among equals. NaN ranks below every
// number. Requires a non-empty span.
int32_t ArgMax(std::span<const float> logits);

// The token for `position` (the index the new token will have in the sequence):
// SampleTokenWithCoin(logits, params, UniformDraw(params.seed, position)).
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, int64_t position);

// The sampling step with the random number passed in (coin in [0, 1)):
//   temperature <= 0 or NaN: ArgMax.
//   w_i = detmath::Exp((logit_i - max) / temperature)            (f32, NaN logits weigh 0)
//   candidates: the top_k tokens in the total order when 0 < top_k < vocab, else all;
//   mass M = sum of w over the candidates (double; id order for all tokens, else sorted);
//   top_p < 1: the nucleus is the shortest sorted prefix whose running sum (double) reaches
//     top_p * M (at least one token), and M becomes that sum;
//   the token is the first in walk order (sorted order when top_k or top_p is active, id
//   order otherwise) whose running sum exceeds coin * M (the last candidate if rounding
//   leaves none).
// A +inf logit is chosen outright (the lowest such id); all logits -inf/NaN gives ArgMax.
// Requires a non-empty span.
int32_t SampleTokenWithCoin(std::span<const float> logits, const SamplingParams& params, float coin);

// End-of-sequence ids (config.json eos_token_id + generation_config.json; for the bundled
// stories260K both 2 and BOS 1). Generation stops after emitting one of them.
struct StopSet {
  std::vector<int32_t> ids;
  bool Contains(int32_t id) const;
};

}  // namespace daisy

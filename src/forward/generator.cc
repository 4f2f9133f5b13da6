#include "daisy/generator.h"

#include <algorithm>
#include <chrono>

namespace daisy {

std::string_view FinishReasonName(FinishReason reason) {
  return reason == FinishReason::kStop ? "stop" : "length";
}

namespace {
double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}
}  // namespace

Result<GenerateResult> Generator::Generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                           const TokenCallback& on_token) {
  DAISY_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  if (prompt.empty()) return InvalidArgument("the prompt has no tokens");
  if (options.max_tokens < 0) return InvalidArgument("max_tokens must not be negative");
  if (options.prefill_chunk < 0) return InvalidArgument("prefill_chunk must not be negative");
  const int ctx = head_.ctx();
  const int n_prompt = static_cast<int>(prompt.size());
  if (n_prompt > ctx)
    return InvalidArgument("the prompt has " + std::to_string(n_prompt) + " tokens; the context holds " +
                           std::to_string(ctx));
  const int first = options.first_position;
  if (first < 0 || first >= n_prompt || first > head_.length())
    return InvalidArgument("first_position " + std::to_string(first) + " is outside the cached prefix (" +
                           std::to_string(head_.length()) + " cached, prompt of " + std::to_string(n_prompt) + ")");
  GenerateResult r;
  r.prefill_tokens = n_prompt - first;
  // prefill: the prompt's keys enter the caches (from the first position not already
  // there); the last position's logits come back
  auto t0 = std::chrono::steady_clock::now();
  const int chunk = options.prefill_chunk > 0 ? options.prefill_chunk : n_prompt - first;
  DAISY_ASSIGN_OR_RETURN(std::vector<float> logits,
                         head_.Prefill(prompt.subspan(static_cast<size_t>(first)), chunk, options.prefill_in_flight, first));
  r.prefill_seconds = Seconds(t0);
  // decode: sample the token for position pos, then run it to get the next logits
  t0 = std::chrono::steady_clock::now();
  int pos = n_prompt;
  if (options.max_tokens == 0 || pos >= ctx) return r;  // "length": no room for a token
  for (;;) {
    if (options.on_step) options.on_step(pos, head_.last_row(), logits);
    // Tokens left: the request's budget or the context's room, whichever ends first.
    if (options.constrain) options.constrain(logits, std::min(options.max_tokens - static_cast<int>(r.ids.size()), ctx - pos));
    const int32_t id = SampleToken(logits, options.sampling, pos);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end()) {
      r.finish_reason = FinishReason::kStop;
      r.stop_id = id;
      break;
    }
    r.ids.push_back(id);
    if (on_token) on_token(id, logits);
    if (options.stop_after && options.stop_after(id)) {
      r.finish_reason = FinishReason::kStop;
      break;
    }
    if (static_cast<int>(r.ids.size()) >= options.max_tokens || pos + 1 >= ctx) break;  // "length"
    DAISY_ASSIGN_OR_RETURN(logits, head_.Forward(std::span<const int32_t>(&id, 1), pos));
    ++pos;
    ++r.decode_steps;
  }
  r.decode_seconds = Seconds(t0);
  return r;
}

}  // namespace daisy

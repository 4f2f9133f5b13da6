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
  r.ids.reserve(static_cast<size_t>(std::min(options.max_tokens, ctx - n_prompt)));  // none per token
  r.prefill_tokens = n_prompt - first;
  // prefill: the prompt's keys enter the caches (from the first position not already
  // there); the last position's logits come back
  auto t0 = std::chrono::steady_clock::now();
  const int chunk = options.prefill_chunk > 0 ? options.prefill_chunk : n_prompt - first;
  DAISY_ASSIGN_OR_RETURN(std::vector<float> logits, head_.Prefill(prompt.subspan(static_cast<size_t>(first)), chunk,
                                                                  options.prefill_in_flight, first));
  r.prefill_seconds = Seconds(t0);
  // decode: sample the token for position pos, then run it to get the next logits. With
  // drafts, one lap runs the token and the drafts after it; row i of its logits predicts
  // position pos + i, and each draft is kept only while it equals the token sampled there,
  // with every hook called exactly as one position at a time would.
  t0 = std::chrono::steady_clock::now();
  int pos = n_prompt;
  if (options.max_tokens == 0 || pos >= ctx) return r;  // "length": no room for a token
  const size_t vocab = logits.size();
  std::vector<int32_t> seq;  // the ids so far, where drafts are looked up
  if (options.lookahead > 0) seq.assign(prompt.begin(), prompt.end());
  std::vector<int32_t> drafts;  // fed at positions pos, pos + 1, ... of the last lap
  std::vector<int32_t> fed;     // a lap's token and drafts (its storage reused: no allocation per token)
  size_t row = 0;               // the row of `logits` that predicts position pos
  bool rows = false;            // the last lap read out every row (drafts), not only the last
  for (;;) {
    std::span<float> lg(logits.data() + row * vocab, vocab);
    if (options.on_step) options.on_step(pos, rows ? head_.row(static_cast<int>(row)) : head_.last_row(), lg);
    // Tokens left: the request's budget or the context's room, whichever ends first.
    if (options.constrain)
      options.constrain(lg, std::min(options.max_tokens - static_cast<int>(r.ids.size()), ctx - pos));
    const int32_t id = SampleToken(lg, options.sampling, pos);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end()) {
      r.finish_reason = FinishReason::kStop;
      r.stop_id = id;
      break;
    }
    r.ids.push_back(id);
    if (on_token) on_token(id, lg);
    if (options.stop_after && options.stop_after(id)) {
      r.finish_reason = FinishReason::kStop;
      break;
    }
    if (static_cast<int>(r.ids.size()) >= options.max_tokens || pos + 1 >= ctx) break;  // "length"
    if (row < drafts.size() && drafts[row] == id) {
      // The draft at pos was right: its lap already gave the logits of pos + 1.
      ++r.accepted;
      ++row;
      ++pos;
      continue;
    }
    // A lap from pos (forgetting rejected drafts after it): the token, then new drafts.
    fed.assign(1, id);
    drafts.clear();
    if (options.lookahead > 0) {
      // The prompt and every id so far, the last one (at pos) included.
      seq.insert(seq.end(), r.ids.begin() + static_cast<std::ptrdiff_t>(seq.size() - prompt.size()), r.ids.end());
      // No draft past what the turn can use: the budget (the lap's own token and the one
      // sampled after the last draft count) and the context (the last position sampled is ctx - 1).
      const int room =
          std::min({options.lookahead, options.max_tokens - static_cast<int>(r.ids.size()) - 1, ctx - 2 - pos});
      if (room > 0) drafts = LookupDraft(seq, room);
      fed.insert(fed.end(), drafts.begin(), drafts.end());
    }
    r.drafted += static_cast<int>(drafts.size());
    ++r.decode_laps;
    rows = !drafts.empty();
    if (rows) {
      DAISY_RETURN_IF_ERROR(head_.ForwardAll(fed, pos, logits));
    } else {
      DAISY_RETURN_IF_ERROR(head_.Forward(fed, pos, logits));
    }
    row = 0;
    ++pos;
  }
  // Positions before pos hold the prompt and the ids fed; rejected drafts after them go, so
  // the cache ends exactly as without drafting.
  r.decode_steps = pos - n_prompt;
  r.rolled_back = head_.length() - pos;
  head_.Truncate(pos);
  r.decode_seconds = Seconds(t0);
  return r;
}

std::vector<int32_t> LookupDraft(std::span<const int32_t> seq, int max_draft) {
  constexpr int kMaxGram = 4, kMinGram = 2;
  const int n = static_cast<int>(seq.size());
  if (max_draft <= 0) return {};
  // Longest suffix first; among its earlier occurrences the most recent (the text's
  // current habit). Bounded: at most n starts per suffix length.
  for (int g = std::min(kMaxGram, n - 1); g >= kMinGram; --g) {
    const auto suffix = seq.subspan(static_cast<size_t>(n - g));
    for (int at = n - g - 1; at >= 0; --at) {
      if (!std::equal(suffix.begin(), suffix.end(), seq.begin() + at)) continue;
      const int from = at + g;  // < n: the occurrence ends before the suffix does
      const int len = std::min(max_draft, n - from);
      return std::vector<int32_t>(seq.begin() + from, seq.begin() + from + len);
    }
  }
  return {};
}

}  // namespace daisy

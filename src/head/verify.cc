// Verify (verify.h): the whole model on the head, or stage by stage when it does not fit.
#include "verify.h"

#include <algorithm>
#include <cstring>

#include "daisy/memory.h"
#include "session.h"

namespace daisy {

namespace head {

void DigestSteps(GenerateOptions& g, std::vector<StepDigest>& steps) {
  g.on_step = [&steps, before = std::move(g.on_step)](int position, std::span<const float> row,
                                                      std::span<const float> logits) {
    if (before) before(position, row, logits);
    steps.push_back({wire::RowsDigest(row), wire::RowsDigest(logits)});
  };
}

namespace {
std::string IdText(std::span<const int32_t> ids, size_t k) {
  return k < ids.size() ? "id " + std::to_string(ids[k]) : std::string("the end of the turn");
}
}  // namespace

void Compare(HeadReport& report, std::span<const int32_t> a, std::span<const StepDigest> da, std::span<const int32_t> b,
             std::span<const StepDigest> db) {
  const size_t n_prompt = report.prompt_ids.size();
  const size_t steps = std::max({a.size(), b.size(), da.size(), db.size()});
  report.verified_steps = static_cast<int>(std::min(da.size(), db.size()));
  for (size_t k = 0; k < steps; ++k) {
    const bool ids_differ = (k < a.size()) != (k < b.size()) || (k < a.size() && a[k] != b[k]);
    const bool both = k < da.size() && k < db.size();
    const bool logits_differ = !both || da[k].logits != db[k].logits;
    const bool row_differ = !both || da[k].row != db[k].row;
    if (!ids_differ && !logits_differ && !row_differ) continue;
    const int position = static_cast<int>(n_prompt + k);
    report.verified = false;
    report.mismatch_position = position;
    report.verified_steps = static_cast<int>(k);
    const std::string where = "MISMATCH: position " + std::to_string(position);
    const std::string token = "generated token " + std::to_string(k);
    if (ids_differ) {
      report.mismatch = "ids differ";
      report.verify_message = where + " (ids differ): " + token + " is " + IdText(a, k) + " in the distributed run, " +
                              IdText(b, k) + " in the single-device run";
    } else if (logits_differ) {
      report.mismatch = "ids equal, logits differ";
      report.verify_message = where + " (ids equal, logits differ): " + token + " (" + IdText(a, k) +
                              " in both runs) was chosen from logits whose bits differ from the single-device run's";
    } else {
      report.mismatch = "ids equal, hidden row differs";
      report.verify_message =
          where + " (ids equal, hidden row differs): the final hidden row that chose " + token + " (" + IdText(a, k) +
          " in both runs) differs in its bits from the single-device run's, though the logits agree";
    }
    return;
  }
  report.verified = true;
  report.verify_message =
      "VERIFIED: the distributed run and the single-device run produced identical token ids and identical bits "
      "(BLAKE2b of the final hidden row and the logits) at all " +
      std::to_string(steps) + " steps.";
}

Result<HiddenStates> ReplayLink::Run(HiddenStates h) {
  const size_t row = static_cast<size_t>(hidden_);
  const size_t at = static_cast<size_t>(h.positions.front()) * row;
  if (at + h.values.size() > in_.size() ||
      std::memcmp(in_.data() + at, h.values.data(), h.values.size() * sizeof(float)) != 0) {
    diverged_ = true;
    return DataLoss("the single-device run left the ring's token sequence at position " +
                    std::to_string(h.positions.front()));
  }
  std::copy(out_.begin() + static_cast<std::ptrdiff_t>(at),
            out_.begin() + static_cast<std::ptrdiff_t>(at + h.values.size()), h.values.begin());
  return h;
}

}  // namespace head

Status HeadSession::Impl::Verify(HeadReport& report, const GenerateOptions& gen,
                                 const std::function<void(const std::string&)>& say) {
  const uint64_t budget = hello().free_memory;
  const uint64_t whole = PlanModelOf(*info, ctx).Need(info->spec.n_layers, true);
  if (verify_pipeline || whole + HeldNow() <= budget) {
    report.verify_mode = "whole model";
    say("verifying: running the whole model on this device");
    return VerifyWhole(report, gen);
  }
  report.verify_mode = "stage by stage";
  say("verifying stage by stage: the whole model (" + FormatBytes(whole) +
      ") does not fit this device's memory budget (" + FormatBytes(budget) + ", " + FormatBytes(HeldNow()) +
      " held now), so the turn is re-run one slice of layers at a time");
  return VerifyByStages(report, gen, say);
}

Status HeadSession::Impl::VerifyWhole(HeadReport& report, const GenerateOptions& gen) {
  if (!verify_pipeline) {
    const int all[] = {info->spec.n_layers};
    DAISY_ASSIGN_OR_RETURN(LocalPipeline local, LocalPipeline::Load(*source, *info, all, ctx));
    verify_pipeline = std::make_unique<LocalPipeline>(std::move(local));
  }
  Generator g(verify_pipeline->head());
  GenerateOptions single_gen = gen;
  std::vector<head::StepDigest> single_steps;
  head::DigestSteps(single_gen, single_steps);
  DAISY_ASSIGN_OR_RETURN(GenerateResult single, g.Generate(report.prompt_ids, single_gen));
  head::Compare(report, report.ids, ring_steps, single.ids, single_steps);
  return Status::Ok();
}

// Stage-by-stage Verify (the chunked, cached and one-shot passes give the same bits): the
// turn's positions go through the head's layers, then through each later slice of layers,
// fetched (from the disk cache when present), run over every position at once and freed,
// keeping only the hidden states; then the single-device generator runs on the head with
// those final rows and its steps are compared with the ring's.
Status HeadSession::Impl::VerifyByStages(HeadReport& report, const GenerateOptions& gen,
                                         const std::function<void(const std::string&)>& say) {
  const ModelSpec& spec = info->spec;
  std::vector<int32_t> seq = report.prompt_ids;
  seq.insert(seq.end(), report.ids.begin(), report.ids.end());
  if (static_cast<int>(seq.size()) > ctx) seq.resize(static_cast<size_t>(ctx));
  const int n = static_cast<int>(seq.size());
  const uint64_t states = 2ull * static_cast<uint64_t>(n) * static_cast<uint64_t>(spec.hidden) * sizeof(float);
  // Slices: the ring's stages, each cut further until it fits beside what the head holds.
  const PlanModel pm = PlanModelOf(*info, n);
  // The head's layers get a second KV cache for the replayed run.
  const uint64_t head_kv = static_cast<uint64_t>(head_weights->end() - head_weights->first()) *
                           (PlanModelOf(*info, ctx).layer_bytes - PlanModelOf(*info, 0).layer_bytes);
  const uint64_t fixed = HeldNow() + head_kv + states + pm.working_bytes;
  const uint64_t budget = hello().free_memory;
  if (pm.layer_bytes > 0 && fixed + pm.layer_bytes > budget)
    return ResourceExhausted("stage-by-stage Verify needs " + FormatBytes(fixed + pm.layer_bytes) +
                             " for one layer beside what this device holds (" + FormatBytes(HeldNow()) +
                             ") and the turn's hidden states (" + FormatBytes(states) + "), but its memory budget is " +
                             FormatBytes(budget) + "; nothing was fetched");
  const int per_slice = pm.layer_bytes > 0
                            ? static_cast<int>(std::min<uint64_t>((budget - fixed) / pm.layer_bytes, spec.n_layers))
                            : spec.n_layers;
  std::vector<std::pair<int, int>> slices;
  for (size_t i = 1; i < report.plan.size(); ++i)
    for (int a = report.plan[i].first; a < report.plan[i].end; a += per_slice)
      slices.push_back({a, std::min(report.plan[i].end, a + per_slice)});
  const int head_end = head_weights->end();
  if (report.plan.empty() || report.plan[0].end != head_end) return Internal("Bug: Verify without the turn's plan");

  // The head's own layers over every position: the rows it sends to stage 1.
  DAISY_ASSIGN_OR_RETURN(HiddenStates h, Embed(*head_weights, seq, 0));
  {
    KvCache kv(spec, 0, head_end, n);
    DAISY_RETURN_IF_ERROR(RunLayers(*head_weights, 0, head_end, h, kv));
  }
  const std::vector<float> first_rows = h.values;
  for (size_t k = 0; k < slices.size(); ++k) {
    const auto [a, b] = slices[k];
    say("verifying: layers [" + std::to_string(a) + ", " + std::to_string(b) + ") (slice " + std::to_string(k + 1) +
        " of " + std::to_string(slices.size()) + ") over " + std::to_string(n) + " positions");
    DAISY_ASSIGN_OR_RETURN(StageWeights w, StageWeights::Load(*source, *info, a, b, false));
    KvCache kv(spec, a, b, n);
    DAISY_RETURN_IF_ERROR(RunLayers(w, a, b, h, kv));
  }  // each slice and its cache are freed before the next is fetched
  head::ReplayLink replay(first_rows, h.values, spec.hidden);
  HeadStage stage(*head_weights, ctx, &replay);
  Generator g(stage);
  GenerateOptions single_gen = gen;
  single_gen.prefill_chunk = 0;  // the whole prompt at once: the same bits as any chunking
  single_gen.prefill_in_flight = 1;
  single_gen.first_position = 0;
  std::vector<head::StepDigest> single_steps;
  head::DigestSteps(single_gen, single_steps);
  std::vector<int32_t> single_ids;
  auto single =
      g.Generate(report.prompt_ids, single_gen, [&](int32_t id, std::span<const float>) { single_ids.push_back(id); });
  if (!single.ok() && !replay.diverged()) return single.status();
  head::Compare(report, report.ids, ring_steps, single_ids, single_steps);
  return Status::Ok();
}

}  // namespace daisy

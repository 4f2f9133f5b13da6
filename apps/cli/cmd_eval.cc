// daisychain eval: teacher-forced scoring of a text (or a list of ids) through the whole
// model on this device: per-position top-1, log-probability of the next token, mean NLL and
// perplexity; optionally every position's logits as raw float32 for comparison with an
// external reference. Positions run in chunks through the KV cache, which gives the same
// bits as one pass over everything (docs/KERNELS.md), with memory bounded by the chunk.
// With --reference, the accuracy report: the ids come from a float64 reference
// (tests/reference/stories_reference.py) and each block of positions gets its top-1
// agreement with the reference and its mean KL(reference || engine).
#include <CLI/CLI.hpp>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "daisy/forward.h"
#include "daisy/kernels.h"
#include "daisy/model.h"
#include "daisy/tokenizer.h"

namespace daisy::cli {
namespace {

struct EvalCliOptions {
  std::string model;
  std::string text_file;
  std::string ids_file;
  std::string dump_logits;
  std::string reference;
  int block = 128;
  bool attention_stats = false;
  int ctx = 0;
  int chunk = 128;
  int threads = 0;
  bool json = false;
  bool no_cache = false;
};

Result<std::string> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<std::vector<int32_t>> ReadIds(const std::string& path) {
  DAISY_ASSIGN_OR_RETURN(std::string text, ReadAll(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) return InvalidArgument(path + ": expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer() || j[i].get<int64_t>() < 0 || j[i].get<int64_t>() > INT32_MAX)
      return InvalidArgument(path + ": element " + std::to_string(i) + " is not a token id: " + j[i].dump());
    ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  return ids;
}

// A float64 reference: the ids and, per position, the reference's log-softmax (rounded to
// float32), from the manifest written by tests/reference/stories_reference.py.
struct Reference {
  std::vector<int32_t> ids;
  int vocab = 0;
  std::vector<float> logprob;  // (ids.size() - 1, vocab)
};

Result<Reference> ReadReference(const std::string& path) {
  DAISY_ASSIGN_OR_RETURN(std::string text, ReadAll(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ids") || !j["ids"].is_array() || !j.contains("vocab") ||
      !j["vocab"].is_number_integer() || !j.contains("logprob") || !j["logprob"].is_string())
    return InvalidArgument(path + ": expected a reference manifest with ids, vocab and logprob");
  Reference ref;
  for (size_t i = 0; i < j["ids"].size(); ++i) {
    const nlohmann::json& v = j["ids"][i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return InvalidArgument(path + ": ids[" + std::to_string(i) + "] is not a token id: " + v.dump());
    ref.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  const int64_t vocab = j["vocab"].get<int64_t>();
  if (vocab < 1 || vocab > (1 << 24)) return InvalidArgument(path + ": vocab " + std::to_string(vocab));
  ref.vocab = static_cast<int>(vocab);
  if (ref.ids.size() < 2) return InvalidArgument(path + ": fewer than 2 ids");
  const std::string file = (std::filesystem::path(path).parent_path() / j["logprob"].get<std::string>()).string();
  DAISY_ASSIGN_OR_RETURN(std::string raw, ReadAll(file));
  const size_t want = (ref.ids.size() - 1) * static_cast<size_t>(ref.vocab);
  if (raw.size() != want * 4)
    return InvalidArgument(file + ": " + std::to_string(raw.size()) + " bytes, expected " + std::to_string(want * 4) +
                           " (" + std::to_string(ref.ids.size() - 1) + " rows of " + std::to_string(ref.vocab) +
                           " float32)");
  ref.logprob.resize(want);
  for (size_t i = 0; i < want; ++i) {
    uint32_t b = 0;
    for (int k = 3; k >= 0; --k) b = (b << 8) | static_cast<uint8_t>(raw[i * 4 + static_cast<size_t>(k)]);
    ref.logprob[i] = std::bit_cast<float>(b);
  }
  return ref;
}

// Writes floats as little-endian float32 whatever the host's byte order.
void WriteF32(std::ofstream& out, std::span<const float> v) {
  if constexpr (std::endian::native == std::endian::little) {
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  } else {
    for (float f : v) {
      const uint32_t b = __builtin_bswap32(std::bit_cast<uint32_t>(f));
      out.write(reinterpret_cast<const char*>(&b), 4);
    }
  }
}

int RunEval(const EvalCliOptions& o) {
  const int sources = !o.text_file.empty() + !o.ids_file.empty() + !o.reference.empty();
  if (sources != 1) return ReportError("give exactly one of --text-file, --ids-file and --reference");
  if (o.threads > 0) kernels::SetThreads(o.threads);
  auto src = OpenSourceForCli(o.model, !o.no_cache);
  if (!src.ok()) return ReportError(src.status().ToString());
  auto info = LoadModelInfo(**src);
  if (!info.ok()) return ReportError(info.status().ToString());
  const ModelSpec& spec = info->spec;

  std::vector<int32_t> ids;
  Reference ref;
  if (!o.reference.empty()) {
    auto r = ReadReference(o.reference);
    if (!r.ok()) return ReportError(r.status().ToString());
    ref = std::move(*r);
    if (ref.vocab != spec.vocab)
      return ReportError(o.reference + ": a reference over " + std::to_string(ref.vocab) +
                         " ids; the model's vocabulary has " + std::to_string(spec.vocab));
    ids = ref.ids;
  } else if (!o.ids_file.empty()) {
    auto r = ReadIds(o.ids_file);
    if (!r.ok()) return ReportError(r.status().ToString());
    ids = std::move(*r);
  } else {
    auto text = ReadAll(o.text_file);
    if (!text.ok()) return ReportError(text.status().ToString());
    auto tok = Tokenizer::Load(**src);
    if (!tok.ok()) return ReportError(tok.status().ToString());
    auto r = tok->Encode(*text, /*add_special_tokens=*/true);
    if (!r.ok()) return ReportError(r.status().ToString());
    ids = std::move(*r);
  }
  if (ids.size() < 2) return ReportError("scoring needs at least 2 tokens, got " + std::to_string(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= spec.vocab)
      return ReportError("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                         " is outside the model's vocabulary of " + std::to_string(spec.vocab));
  // Row i predicts ids[i + 1]: the last id is only a target.
  const int positions = static_cast<int>(ids.size()) - 1;
  const int ctx = o.ctx > 0 ? o.ctx : DefaultContext(spec);
  if (Status st = CheckContext(spec, ctx); !st.ok()) return ReportError(st.ToString());
  if (positions > ctx)
    return ReportError(std::to_string(ids.size()) + " tokens need " + std::to_string(positions) +
                       " positions; the context holds " + std::to_string(ctx) + " (see --ctx)");

  auto pipeline = LocalPipeline::Load(**src, *info, std::vector<int>{spec.n_layers}, ctx);
  if (!pipeline.ok()) return ReportError(pipeline.status().ToString());

  std::ofstream dump;
  if (!o.dump_logits.empty()) {
    dump.open(o.dump_logits, std::ios::binary | std::ios::trunc);
    if (!dump) return ReportError("cannot write " + o.dump_logits);
  }
  std::vector<int32_t> top1(static_cast<size_t>(positions));
  std::vector<double> logprob(static_cast<size_t>(positions));
  // Against the reference: KL(reference || engine) and whether the two argmaxes agree.
  std::vector<double> kl(static_cast<size_t>(positions));
  std::vector<uint8_t> agree(static_cast<size_t>(positions));
  AttentionMassStats mass;
  if (o.attention_stats) SetAttentionMassStats(&mass);
  double nll_sum = 0;
  int correct = 0;
  const size_t vocab = static_cast<size_t>(spec.vocab);
  for (int at = 0; at < positions; at += o.chunk) {
    const int n = std::min(o.chunk, positions - at);
    auto logits = pipeline->head().ForwardAll(
        std::span<const int32_t>(ids).subspan(static_cast<size_t>(at), static_cast<size_t>(n)), at);
    if (!logits.ok()) return ReportError(logits.status().ToString());
    if (dump.is_open()) WriteF32(dump, *logits);
    for (int r = 0; r < n; ++r) {
      const float* row = &(*logits)[static_cast<size_t>(r) * vocab];
      const int i = at + r;
      const int32_t target = ids[static_cast<size_t>(i) + 1];
      // Scoring statistics in double (a measurement of the output, not the forward pass).
      int32_t best = 0;
      for (size_t j = 1; j < vocab; ++j)
        if (row[j] > row[static_cast<size_t>(best)]) best = static_cast<int32_t>(j);
      const double m = row[static_cast<size_t>(best)];
      double s = 0;
      for (size_t j = 0; j < vocab; ++j) s += std::exp(static_cast<double>(row[j]) - m);
      const double lp = static_cast<double>(row[static_cast<size_t>(target)]) - m - std::log(s);
      top1[static_cast<size_t>(i)] = best;
      logprob[static_cast<size_t>(i)] = lp;
      nll_sum -= lp;
      correct += best == target;
      if (!ref.logprob.empty()) {
        const float* rl = &ref.logprob[static_cast<size_t>(i) * vocab];
        size_t rbest = 0;
        double d = 0;
        for (size_t j = 0; j < vocab; ++j) {
          if (rl[j] > rl[rbest]) rbest = j;
          const double lq = static_cast<double>(row[j]) - m - std::log(s);
          d += std::exp(static_cast<double>(rl[j])) * (static_cast<double>(rl[j]) - lq);
        }
        kl[static_cast<size_t>(i)] = d;
        agree[static_cast<size_t>(i)] = rbest == static_cast<size_t>(best);
      }
    }
  }
  SetAttentionMassStats(nullptr);
  if (dump.is_open()) {
    dump.close();
    if (!dump) return ReportError("writing " + o.dump_logits + " failed");
  }
  const double mean_nll = nll_sum / positions;
  const double ppl = std::exp(mean_nll);
  // The report per block of positions [b, b + block).
  nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
  int agree_all = 0;
  double kl_all = 0;
  if (!ref.logprob.empty()) {
    for (int b = 0; b < positions; b += o.block) {
      const int e = std::min(positions, b + o.block);
      int a = 0;
      double sum = 0, mx = 0;
      for (int i = b; i < e; ++i) {
        a += agree[static_cast<size_t>(i)];
        sum += kl[static_cast<size_t>(i)];
        mx = std::max(mx, kl[static_cast<size_t>(i)]);
      }
      agree_all += a;
      kl_all += sum;
      blocks.push_back({{"begin", b},
                        {"end", e},
                        {"top1_agree", a},
                        {"top1_agreement", static_cast<double>(a) / (e - b)},
                        {"mean_kl", sum / (e - b)},
                        {"max_kl", mx}});
    }
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = (*src)->Describe();
    j["tokens"] = ids.size();
    j["positions"] = positions;
    j["mean_nll"] = mean_nll;
    j["perplexity"] = ppl;
    j["top1_accuracy"] = static_cast<double>(correct) / positions;
    j["top1"] = top1;
    j["logprob"] = logprob;
    j["backend"] = std::string(kernels::BackendName(kernels::ActiveBackend()));
    if (!ref.logprob.empty()) {
      j["reference"] = o.reference;
      j["reference_top1_agreement"] = static_cast<double>(agree_all) / positions;
      j["reference_mean_kl"] = kl_all / positions;
      j["blocks"] = blocks;
    }
    if (o.attention_stats)
      j["attention"] = {{"rows", mass.rows},
                        {"l1_mean", mass.rows ? mass.l1_sum / static_cast<double>(mass.rows) : 0.0},
                        {"l1_max", mass.l1_max},
                        {"flushed_mean", mass.rows ? mass.flushed_sum / static_cast<double>(mass.rows) : 0.0},
                        {"flushed_max", mass.flushed_max}};
    if (!o.dump_logits.empty()) {
      j["logits_file"] = o.dump_logits;
      j["logits_shape"] = {positions, spec.vocab};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("positions %d  mean NLL %.4f nats  perplexity %.3f  top-1 accuracy %.1f%%\n", positions, mean_nll, ppl,
                100.0 * correct / positions);
    if (!ref.logprob.empty()) {
      std::printf("against %s: top-1 agreement %d/%d (%.2f%%), mean KL %.3g nats\n", o.reference.c_str(), agree_all,
                  positions, 100.0 * agree_all / positions, kl_all / positions);
      std::printf("%-11s %9s %10s %10s\n", "positions", "top-1", "mean KL", "max KL");
      for (const auto& b : blocks)
        std::printf("%4d-%-6d %8.2f%% %10.3g %10.3g\n", b["begin"].get<int>(), b["end"].get<int>() - 1,
                    100.0 * b["top1_agreement"].get<double>(), b["mean_kl"].get<double>(), b["max_kl"].get<double>());
    }
    if (o.attention_stats)
      std::printf(
          "attention rows %lld: probability moved by int8 P (L1) mean %.3g max %.3g; flushed to zero mean "
          "%.3g max %.3g\n",
          static_cast<long long>(mass.rows), mass.rows ? mass.l1_sum / static_cast<double>(mass.rows) : 0.0,
          mass.l1_max, mass.rows ? mass.flushed_sum / static_cast<double>(mass.rows) : 0.0, mass.flushed_max);
    if (!o.dump_logits.empty())
      std::printf("logits: %s, float32 little-endian [%d, %d], row i predicts token i+1\n", o.dump_logits.c_str(),
                  positions, spec.vocab);
  }
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(eval, 30, [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<EvalCliOptions>();
  CLI::App* sub = app.add_subcommand("eval", "Teacher-forced scoring: per-position top-1, log-prob, perplexity");
  sub->add_option("--model", o->model, "Local folder or Hub repo id owner/name[@revision]")->required();
  auto* text =
      sub->add_option("--text-file", o->text_file, "Text to score (tokenized with the model's tokenizer, BOS added)");
  auto* ids = sub->add_option("--ids-file", o->ids_file, "JSON array of token ids to score");
  text->excludes(ids);
  sub->add_option("--reference", o->reference,
                  "Accuracy report against a float64 reference manifest (testdata/reference/stories260K/*.json): "
                  "scores its ids, prints top-1 agreement and mean KL per block of positions");
  sub->add_option("--block", o->block, "Positions per block of the --reference report (default 128)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_flag("--attention-stats", o->attention_stats,
                "Measure the attention probability the int8 form of P loses per row (L1 and mass flushed to zero)");
  sub->add_option("--dump-logits", o->dump_logits,
                  "Write float32 little-endian logits [positions, vocab], row i predicting token i+1");
  sub->add_option("--ctx", o->ctx, "Context length (default: the model's, at most 4096)");
  sub->add_option("--chunk", o->chunk, "Positions per forward step (default 128)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--threads", o->threads, "Kernel threads (default: all cores)")->check(CLI::Range(1, 1024));
  sub->add_flag("--json", o->json, "Print one JSON object: positions, mean_nll, perplexity, top1, logprob");
  sub->add_flag("--no-cache", o->no_cache, "Do not use the on-disk download cache");
  return [o] { return RunEval(*o); };
});

}  // namespace daisy::cli

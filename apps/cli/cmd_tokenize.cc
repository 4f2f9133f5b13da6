// daisychain tokenize: encodes text with a model's tokenizer.json (+ tokenizer_config.json)
// and prints the ids and their pieces; with --input-jsonl, encodes and decodes every line of
// a {"text": ...} file and writes one JSON result per line, in order.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "daisy/tokenizer.h"

namespace daisy::cli {
namespace {

using nlohmann::json;
using ordered = nlohmann::ordered_json;

struct TokenizeOptions {
  std::string model;
  std::optional<std::string> text;
  std::string input_jsonl;
  bool json = false;
  bool no_special = false;
  bool no_cache = false;
};

template <typename J>
std::string Dump(const J& j) {
  return j.dump(-1, ' ', false, J::error_handler_t::replace);
}

// A JSON array with ", " between elements: [1, 403, 407].
template <typename T>
std::string List(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += Dump(json(v[i]));
  }
  return s + "]";
}

int RunJsonl(const Tokenizer& tk, const std::string& path) {
  std::ifstream in(path);
  if (!in) return ReportError(path + ": cannot open");
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json row = json::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object() || !row.contains("text") || !row["text"].is_string()) {
      return ReportError(path + ":" + std::to_string(line_no) + ": expected a JSON object with a string \"text\"");
    }
    const std::string text = row["text"].get<std::string>();
    auto ids = tk.Encode(text, false);
    if (!ids.ok()) return ReportError(path + ":" + std::to_string(line_no) + ": " + ids.status().message());
    auto ids_special = tk.Encode(text, true);
    if (!ids_special.ok())
      return ReportError(path + ":" + std::to_string(line_no) + ": " + ids_special.status().message());
    ordered out = ordered::object();
    out["ids"] = *ids;
    out["ids_special"] = *ids_special;
    out["decoded"] = tk.Decode(*ids, false);
    out["decoded_raw"] = tk.Decode(*ids, false, false);
    std::string s = Dump(out);
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fputc('\n', stdout);
  }
  return std::fflush(stdout) == 0 ? 0 : ReportError("cannot write the output");
}

int RunTokenize(const TokenizeOptions& o) {
  if (!o.text && o.input_jsonl.empty()) return ReportError("give TEXT or --input-jsonl FILE", 2);
  if (o.text && !o.input_jsonl.empty()) return ReportError("give either TEXT or --input-jsonl, not both", 2);
  auto src = OpenSourceForCli(o.model, !o.no_cache);
  if (!src.ok()) return ReportError(src.status().message());
  auto tk = Tokenizer::Load(**src);
  if (!tk.ok()) return ReportError(tk.status().message());
  if (!o.input_jsonl.empty()) return RunJsonl(*tk, o.input_jsonl);

  auto ids = tk->Encode(*o.text, !o.no_special);
  if (!ids.ok()) return ReportError(ids.status().message());
  std::vector<std::string> pieces;
  for (int32_t id : *ids) pieces.push_back(tk->IdToPiece(id));
  if (o.json) {
    ordered out = ordered::object();
    out["ids"] = *ids;
    out["pieces"] = pieces;
    out["decoded"] = tk->Decode(*ids, false);
    std::printf("%s\n", Dump(out).c_str());
    return 0;
  }
  std::printf("ids:    %s\n", List(*ids).c_str());
  std::printf("pieces: %s\n", List(pieces).c_str());
  std::printf("count:  %zu\n", ids->size());
  return 0;
}

}  // namespace

DAISY_REGISTER_COMMAND(tokenize, 50, [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<TokenizeOptions>();
  auto* sub = app.add_subcommand("tokenize",
                                 "Encode TEXT with the model's tokenizer and print ids and pieces, or encode and "
                                 "decode every {\"text\": ...} line of --input-jsonl");
  sub->add_option("--model", o->model, "Local folder or Hub repo id owner/name[@revision]")->required();
  sub->add_option("text", o->text, "Text to encode");
  sub->add_option("--input-jsonl", o->input_jsonl,
                  "File of {\"text\": ...} lines; writes {\"ids\", \"ids_special\", \"decoded\", \"decoded_raw\"} "
                  "per line");
  sub->add_flag("--json", o->json, "Print one JSON object (TEXT form)");
  sub->add_flag("--no-special", o->no_special, "Do not add the post-processor's special tokens (TEXT form)");
  sub->add_flag("--no-cache", o->no_cache, "Do not use the on-disk download cache");
  return [o] { return RunTokenize(*o); };
});

}  // namespace daisy::cli

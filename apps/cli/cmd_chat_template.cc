// daisychain chat-template: renders a model's chat template (chat_template.jinja or
// tokenizer_config.json "chat_template") over every {"messages", "add_generation_prompt",
// "kwargs"} line of --input-jsonl and writes one {"rendered": ...} or {"error": ...} line
// per input line, in order. SRC needs only the tokenizer files, no weights or config.json.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.h"
#include "commands.h"
#include "daisy/chat_template.h"

namespace daisy::cli {
namespace {

using json = nlohmann::ordered_json;

struct ChatTemplateOptions {
  std::string model;
  std::string input_jsonl;
  std::string output;
  bool no_cache = false;
};

// One output line for one input line.
json RenderLine(const ChatTemplate& parsed, const ModelChatTemplate& t, const std::string& line, size_t line_no) {
  json out = json::object();
  auto fail = [&](const std::string& why) {
    out["error"] = "line " + std::to_string(line_no) + ": " + why;
    return out;
  };
  json row = json::parse(line, nullptr, false);
  if (row.is_discarded() || !row.is_object()) return fail("not a JSON object");
  if (!row.contains("messages") || !row["messages"].is_array()) return fail("expected an array \"messages\"");
  bool add_generation_prompt = false;
  if (row.contains("add_generation_prompt")) {
    if (!row["add_generation_prompt"].is_boolean()) return fail("\"add_generation_prompt\" must be true or false");
    add_generation_prompt = row["add_generation_prompt"].get<bool>();
  }
  std::string kwargs;
  if (row.contains("kwargs") && !row["kwargs"].is_null()) {
    if (!row["kwargs"].is_object()) return fail("\"kwargs\" must be a JSON object");
    kwargs = row["kwargs"].dump();
  }
  auto r = ApplyChatTemplate(parsed, t, row["messages"].dump(), add_generation_prompt, kwargs);
  if (r.ok()) {
    out["rendered"] = *r;
  } else {
    out["error"] = r.status().message();  // raise_exception's message, as transformers shows it
  }
  return out;
}

int RunChatTemplate(const ChatTemplateOptions& o) {
  auto src = OpenSourceForCli(o.model, !o.no_cache);
  if (!src.ok()) return ReportError(src.status().message());
  auto t = LoadChatTemplate(**src);
  if (!t.ok()) return ReportError(t.status().message());
  auto parsed = ChatTemplate::Parse(t->source);
  if (!parsed.ok()) return ReportError("the chat template of " + (*src)->Describe() + ": " + parsed.status().message());

  std::ifstream in(o.input_jsonl);
  if (!in) return ReportError(o.input_jsonl + ": cannot open");
  std::FILE* out = stdout;
  if (!o.output.empty()) {
    out = std::fopen(o.output.c_str(), "wb");
    if (!out) return ReportError(o.output + ": cannot open for writing");
  }
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string s = RenderLine(*parsed, *t, line, line_no).dump(-1, ' ', false, json::error_handler_t::replace);
    s += '\n';
    std::fwrite(s.data(), 1, s.size(), out);
  }
  const bool ok = std::fflush(out) == 0 && !std::ferror(out);
  if (out != stdout) std::fclose(out);
  return ok ? 0 : ReportError("cannot write the output");
}

}  // namespace

// DAISY_REGISTER_COMMAND would register the name "chat_template" (its argument must be an
// identifier) and main() looks the subcommand up by that name, so register directly.
static const CommandRegistrar kChatTemplateRegistrar("chat-template", 55, [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<ChatTemplateOptions>();
  auto* sub = app.add_subcommand("chat-template",
                                 "Render the model's chat template over every {\"messages\", "
                                 "\"add_generation_prompt\", \"kwargs\"} line of --input-jsonl");
  sub->add_option("--model", o->model, "Local folder or Hub repo id owner/name[@revision] (tokenizer files suffice)")
      ->required();
  sub->add_option("--input-jsonl", o->input_jsonl,
                  "File of {\"messages\": [...], \"add_generation_prompt\": bool, \"kwargs\": {...}} lines; writes "
                  "{\"rendered\": ...} or {\"error\": ...} per line")
      ->required();
  sub->add_option("--output", o->output, "Write the JSON lines here instead of stdout");
  sub->add_flag("--no-cache", o->no_cache, "Do not use the on-disk download cache");
  return [o] { return RunChatTemplate(*o); };
});

}  // namespace daisy::cli

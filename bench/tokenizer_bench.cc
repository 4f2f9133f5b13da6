// Tokenizer throughput: bytes of English text encoded per second on one core, for the
// GPT-2 byte-level BPE (the acceptance figure: at least 5 MB/s) and the other families.
// The text is 1 MB of seeded pseudo-English (common words, capitals, punctuation, numbers,
// newlines), so the word cache sees a realistic mix of repeats and new words.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "daisy/source.h"
#include "daisy/tokenizer.h"

namespace {

std::string EnglishText(size_t bytes) {
  static constexpr const char* kWords[] = {"the",
                                           "of",
                                           "and",
                                           "to",
                                           "in",
                                           "a",
                                           "is",
                                           "that",
                                           "for",
                                           "it",
                                           "as",
                                           "was",
                                           "with",
                                           "be",
                                           "by",
                                           "on",
                                           "not",
                                           "he",
                                           "I",
                                           "this",
                                           "are",
                                           "or",
                                           "his",
                                           "from",
                                           "at",
                                           "which",
                                           "but",
                                           "have",
                                           "an",
                                           "had",
                                           "they",
                                           "you",
                                           "were",
                                           "their",
                                           "one",
                                           "all",
                                           "we",
                                           "can",
                                           "her",
                                           "has",
                                           "there",
                                           "been",
                                           "if",
                                           "more",
                                           "when",
                                           "will",
                                           "would",
                                           "who",
                                           "so",
                                           "no",
                                           "time",
                                           "people",
                                           "year",
                                           "way",
                                           "day",
                                           "man",
                                           "thing",
                                           "woman",
                                           "life",
                                           "child",
                                           "world",
                                           "school",
                                           "state",
                                           "family",
                                           "student",
                                           "group",
                                           "country",
                                           "problem",
                                           "hand",
                                           "part",
                                           "place",
                                           "case",
                                           "week",
                                           "company",
                                           "system",
                                           "program",
                                           "question",
                                           "work",
                                           "government",
                                           "number",
                                           "night",
                                           "point",
                                           "home",
                                           "water",
                                           "room",
                                           "mother",
                                           "area",
                                           "money",
                                           "story",
                                           "fact",
                                           "month",
                                           "lot",
                                           "right",
                                           "study",
                                           "book",
                                           "eye",
                                           "job",
                                           "word",
                                           "business",
                                           "issue",
                                           "side",
                                           "kind",
                                           "head",
                                           "house",
                                           "service",
                                           "friend",
                                           "father",
                                           "power",
                                           "hour",
                                           "game",
                                           "line",
                                           "end",
                                           "member",
                                           "law",
                                           "car",
                                           "city",
                                           "community",
                                           "name",
                                           "president",
                                           "team",
                                           "minute",
                                           "idea",
                                           "kid",
                                           "body",
                                           "information",
                                           "back",
                                           "parent",
                                           "face",
                                           "others",
                                           "level",
                                           "office",
                                           "door",
                                           "health",
                                           "person",
                                           "art",
                                           "war",
                                           "history",
                                           "party",
                                           "result",
                                           "change",
                                           "morning",
                                           "reason",
                                           "research",
                                           "girl",
                                           "guy",
                                           "moment",
                                           "air",
                                           "teacher",
                                           "force",
                                           "education",
                                           "foot",
                                           "boy",
                                           "age",
                                           "policy",
                                           "everything",
                                           "process",
                                           "music",
                                           "market",
                                           "sense",
                                           "nation",
                                           "plan",
                                           "college",
                                           "interest",
                                           "death",
                                           "experience",
                                           "effect",
                                           "use",
                                           "class",
                                           "control",
                                           "care",
                                           "field",
                                           "development",
                                           "role",
                                           "effort",
                                           "rate",
                                           "heart",
                                           "drug",
                                           "show",
                                           "leader",
                                           "light",
                                           "voice",
                                           "wife",
                                           "police",
                                           "mind",
                                           "price",
                                           "report",
                                           "decision",
                                           "son",
                                           "view",
                                           "relationship",
                                           "town",
                                           "road",
                                           "arm",
                                           "difference",
                                           "value",
                                           "building",
                                           "action",
                                           "model",
                                           "season",
                                           "society",
                                           "tax",
                                           "director",
                                           "position",
                                           "player",
                                           "record",
                                           "paper",
                                           "space",
                                           "ground",
                                           "form",
                                           "event",
                                           "official",
                                           "matter",
                                           "center",
                                           "couple",
                                           "site",
                                           "project",
                                           "activity",
                                           "star",
                                           "table",
                                           "need",
                                           "court",
                                           "American",
                                           "oil",
                                           "situation",
                                           "cost",
                                           "industry",
                                           "figure",
                                           "street",
                                           "image",
                                           "phone",
                                           "data",
                                           "picture",
                                           "practice",
                                           "piece",
                                           "land",
                                           "product",
                                           "doctor",
                                           "wall",
                                           "patient",
                                           "worker",
                                           "news",
                                           "test",
                                           "movie",
                                           "north",
                                           "love",
                                           "support",
                                           "technology",
                                           "step",
                                           "baby",
                                           "computer",
                                           "type",
                                           "attention",
                                           "film",
                                           "Republican",
                                           "tree",
                                           "source",
                                           "organization",
                                           "hair",
                                           "window",
                                           "evidence",
                                           "population",
                                           "site",
                                           "extraordinary",
                                           "misunderstanding",
                                           "don't",
                                           "it's",
                                           "we're",
                                           "they've",
                                           "I'm",
                                           "you'll",
                                           "she'd"};
  std::mt19937_64 rng(20240611);
  std::string s;
  s.reserve(bytes + 64);
  bool start = true;
  while (s.size() < bytes) {
    std::string w = kWords[rng() % std::size(kWords)];
    if (start && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 32);
    if (rng() % 40 == 0) w = std::to_string(rng() % 100000);
    s += w;
    start = false;
    switch (rng() % 24) {
      case 0:
        s += ". ";
        start = true;
        break;
      case 1:
        s += ", ";
        break;
      case 2:
        s += "? ";
        start = true;
        break;
      case 3:
        s += ".\n\n";
        start = true;
        break;
      default:
        s += ' ';
        break;
    }
  }
  return s;
}

// The texts of the conformance cases (every script, emoji, code, numbers), repeated to 1 MB.
std::string CorpusText(size_t bytes) {
  std::ifstream in(DAISY_TESTDATA "/tokenizers/gpt2/cases.jsonl");
  std::string line, all;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("text") && j["text"].is_string()) all += j["text"].get<std::string>() + "\n";
  }
  if (all.empty()) return all;
  std::string s;
  while (s.size() < bytes) s += all;
  return s;
}

const std::string& Text() {
  static const std::string t = EnglishText(1 << 20);
  return t;
}

std::unique_ptr<daisy::Tokenizer> LoadOrDie(const std::string& dir) {
  auto src = daisy::OpenLocalFolder(dir);
  if (!src.ok()) {
    std::fprintf(stderr, "%s\n", src.status().ToString().c_str());
    std::exit(1);
  }
  auto t = daisy::Tokenizer::Load(**src);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  return std::make_unique<daisy::Tokenizer>(std::move(t).value());
}

void BM_Encode(benchmark::State& state, const std::string& dir) {
  static std::string loaded_dir;
  static std::unique_ptr<daisy::Tokenizer> tk;
  if (loaded_dir != dir) {
    tk = LoadOrDie(dir);
    loaded_dir = dir;
  }
  const std::string& text = Text();
  size_t n_ids = 0;
  for (auto _ : state) {
    auto ids = tk->Encode(text, false);
    if (!ids.ok()) {
      state.SkipWithError(ids.status().ToString().c_str());
      return;
    }
    n_ids = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_ids);
  state.counters["bytes_per_token"] = static_cast<double>(text.size()) / static_cast<double>(n_ids);
}

void BM_EncodeCorpus(benchmark::State& state, const std::string& dir) {
  auto tk = LoadOrDie(dir);
  static const std::string text = CorpusText(1 << 20);
  for (auto _ : state) {
    auto ids = tk->Encode(text, false);
    benchmark::DoNotOptimize(ids.ok());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

void BM_Decode(benchmark::State& state, const std::string& dir) {
  auto tk = LoadOrDie(dir);
  auto ids = tk->Encode(Text(), false);
  for (auto _ : state) {
    std::string s = tk->Decode(*ids, false);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * Text().size()));
}

constexpr const char* kData = DAISY_TESTDATA "/tokenizers/";

BENCHMARK_CAPTURE(BM_Encode, gpt2, std::string(kData) + "gpt2")->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK_CAPTURE(BM_Encode, llama3, std::string(kData) + "llama3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, qwen3, std::string(kData) + "qwen3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, mistral, std::string(kData) + "mistral")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCorpus, gpt2, std::string(kData) + "gpt2")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCorpus, qwen3, std::string(kData) + "qwen3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, gpt2, std::string(kData) + "gpt2")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

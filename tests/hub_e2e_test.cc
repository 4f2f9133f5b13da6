// End-to-end: `daisychain inspect` and stage fetches against TestHub, a real HTTP server on
// 127.0.0.1 that counts requests and bytes (no test reaches the internet).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "daisy/hub.h"
#include "daisy/model.h"
#include "daisy/safetensors.h"
#include "e2e_util.h"
#include "model_maker.h"
#include "test_hub.h"

namespace daisy {
namespace {

namespace fs = std::filesystem;
using testing::TestHub;

constexpr const char* kToken = "hf_e2eSecretToken0123456789";

// A Llama model whose safetensors file is sparse: a real header, then `data` bytes of
// holes. Inspect must cost the same whatever `data` is.
void WriteSparseLlama(const fs::path& dir, int hidden, int intermediate, int vocab, int layers) {
  fs::create_directories(dir);
  const int heads = 8, kv = 4, hd = hidden / heads;
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", hidden},
                           {"intermediate_size", intermediate},
                           {"num_hidden_layers", layers},
                           {"num_attention_heads", heads},
                           {"num_key_value_heads", kv},
                           {"vocab_size", vocab},
                           {"max_position_embeddings", 4096},
                           {"rms_norm_eps", 1e-5},
                           {"tie_word_embeddings", true}};
  std::ofstream(dir / "config.json") << config.dump(2);
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {{"model.embed_tokens.weight", {vocab, hidden}},
                                                                       {"model.norm.weight", {hidden}}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "input_layernorm.weight", {hidden}});
    tensors.push_back({p + "post_attention_layernorm.weight", {hidden}});
    tensors.push_back({p + "self_attn.q_proj.weight", {heads * hd, hidden}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kv * hd, hidden}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kv * hd, hidden}});
    tensors.push_back({p + "self_attn.o_proj.weight", {hidden, heads * hd}});
    tensors.push_back({p + "mlp.gate_proj.weight", {intermediate, hidden}});
    tensors.push_back({p + "mlp.up_proj.weight", {intermediate, hidden}});
    tensors.push_back({p + "mlp.down_proj.weight", {hidden, intermediate}});
  }
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  uint64_t off = 0;
  for (auto& [name, shape] : tensors) {
    uint64_t n = 2;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string h = header.dump();
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  const fs::path file = dir / "model.safetensors";
  { std::ofstream(file, std::ios::binary) << prefix << h; }
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(8 + h.size() + off)), 0);
}

// Bytes asked for by a "bytes=a-b" Range header.
uint64_t RangeLength(const std::string& range) {
  const size_t eq = range.find('='), dash = range.find('-');
  if (eq == std::string::npos || dash == std::string::npos) return 0;
  return std::stoull(range.substr(dash + 1)) - std::stoull(range.substr(eq + 1, dash - eq - 1)) + 1;
}

class HubE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/daisy_hub_e2e_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    root_ = tmp_ / "repos";
    fs::create_directories(tmp_ / "scratch");
    fs::create_directories(root_ / "acme");
    fs::copy(e2e::Models() + "/stories260K", root_ / "acme/stories", fs::copy_options::recursive);
    auto hub = TestHub::Start(root_.string());
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(*hub);
  }
  void TearDown() override {
    hub_.reset();
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  // The environment of a child: this hub, a private cache, no token unless given.
  std::string Env(const std::string& token = "") const {
    std::string env =
        "-u HF_TOKEN -u http_proxy -u HTTP_PROXY -u https_proxy -u HTTPS_PROXY HF_ENDPOINT=" + hub_->endpoint() +
        " DAISY_CACHE_DIR=" + (tmp_ / "cache").string() + " HF_HOME=" + (tmp_ / "hf").string() +
        " HF_TOKEN_PATH=" + (tmp_ / "no-token").string();
    if (!token.empty()) env += " HF_TOKEN=" + token;
    return env;
  }
  e2e::RunResult Cli(const std::string& args, const std::string& token = "") {
    return e2e::RunCli(Env(token), args, (tmp_ / "scratch").string());
  }
  HubOptions Options() const {
    HubOptions o;
    o.endpoint = hub_->endpoint();
    o.allow_token_prompt = false;
    o.cache_dir = (tmp_ / "cache").string();
    o.initial_backoff_s = 0.01;
    return o;
  }
  // Ranged reads of `file` (a HEAD that pins the revision is not a read).
  uint64_t FileRequests(const std::string& file) const {
    uint64_t n = 0;
    for (const auto& r : hub_->requests())
      if (r.path.ends_with("/" + file) && r.method == "GET" && !r.range.empty()) ++n;
    return n;
  }

  fs::path tmp_, root_;
  std::unique_ptr<TestHub> hub_;
};

TEST_F(HubE2E, InspectReadsOnlyConfigTokenizerAndHeaders) {
  auto r = Cli("inspect --model acme/stories --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["parameters"], 260032);
  EXPECT_EQ(j["family"], "llama");
  EXPECT_EQ(j["revision"], TestHub::CommitFor("acme/stories"));
  const std::set<std::string> allowed = {"config.json",       "generation_config.json",
                                         "tokenizer.json",    "tokenizer_config.json",
                                         "model.safetensors", "model.safetensors.index.json"};
  uint64_t weight_file_bytes = 0;
  const auto reqs = hub_->requests();
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::string file = reqs[i].path.substr(reqs[i].path.rfind('/') + 1);
    EXPECT_TRUE(allowed.count(file)) << reqs[i].path;
    // Every request after the first names the pinned commit, not "main".
    if (i > 0) {
      EXPECT_NE(reqs[i].path.find(TestHub::CommitFor("acme/stories")), std::string::npos) << reqs[i].path;
    }
    if (file == "model.safetensors") {
      EXPECT_FALSE(reqs[i].range.empty()) << "weights must be read by range";
      weight_file_bytes += RangeLength(reqs[i].range);
    }
  }
  // Only the 8-byte length and the JSON header of model.safetensors were transferred.
  EXPECT_EQ(j["header_bytes"].get<uint64_t>(), 8u + 4856u);
  EXPECT_EQ(weight_file_bytes, 8u + 4856u);
}

TEST_F(HubE2E, InspectCostsTheSameForAMultiGigabyteModel) {
  WriteSparseLlama(root_ / "acme/small", 64, 128, 512, 4);
  WriteSparseLlama(root_ / "acme/huge", 8192, 28672, 128256, 4);
  ASSERT_GT(fs::file_size(root_ / "acme/huge/model.safetensors"), 4'000'000'000ull);
  auto small = Cli("inspect --model acme/small --json");
  ASSERT_EQ(small.exit_code, 0) << small.err;
  const uint64_t small_bytes = hub_->body_bytes_sent();
  hub_->ResetCounters();
  auto huge = Cli("inspect --model acme/huge --json");
  ASSERT_EQ(huge.exit_code, 0) << huge.err;
  const uint64_t huge_bytes = hub_->body_bytes_sent();
  EXPECT_GT(nlohmann::json::parse(huge.out)["parameters"].get<uint64_t>(), 2'000'000'000ull);
  // The headers differ only in the digits of their numbers.
  EXPECT_LT(huge_bytes, small_bytes + 1024) << "small " << small_bytes << " huge " << huge_bytes;
  EXPECT_LT(huge_bytes, 20000u);
}

TEST_F(HubE2E, AStageFetchTakesAboutOneRequestPerFileAndOnlyItsBytes) {
  modelmaker::ModelShape shape = modelmaker::PresetShape("tiny-llama-30");
  shape.hidden = 512;
  shape.intermediate = 1536;
  shape.n_layers = 12;
  shape.n_heads = 8;
  shape.n_kv_heads = 2;
  shape.head_dim = 64;
  modelmaker::MakeOptions mo;
  ASSERT_TRUE(modelmaker::MakeModel(shape, (root_ / "acme/mid").string(), mo).ok());
  auto src = OpenModelSource("acme/mid", Options());
  ASSERT_TRUE(src.ok()) << src.status().message();
  auto info = LoadModelInfo(**src);
  ASSERT_TRUE(info.ok()) << info.status().message();

  for (auto [first, end, max_requests] : {std::tuple{2, 4, 1}, std::tuple{5, 9, 1}, std::tuple{1, 3, 2}}) {
    hub_->ResetCounters();
    const auto names = StageTensorNames(info->spec, first, end, false);
    const uint64_t want = TensorBytes(info->index, names);
    uint64_t got = 0;
    HubOptions no_cache = Options();
    no_cache.use_cache = false;
    auto fresh = OpenModelSource("acme/mid", no_cache);
    ASSERT_TRUE(fresh.ok());
    ASSERT_TRUE(FetchTensors(**fresh, info->index, names, [&](const TensorInfo& t, std::span<const float>) {
                  got += t.bytes;
                  return Status::Ok();
                }).ok());
    EXPECT_EQ(got, want);
    // Layers [1, 3) are two runs in the file's name order (layers.1, layers.10, layers.11, layers.2).
    EXPECT_LE(static_cast<int>(FileRequests("model.safetensors")), max_requests) << first << ".." << end;
    const uint64_t sent = hub_->body_bytes_sent();
    EXPECT_GE(sent, want);
    EXPECT_LE(static_cast<double>(sent), 1.01 * static_cast<double>(want) + 4096) << first << ".." << end;
  }
}

TEST_F(HubE2E, TheSecondFetchOfASliceIsServedFromTheCache) {
  auto fetch = [&] {
    auto src = OpenModelSource("acme/stories", Options());
    EXPECT_TRUE(src.ok());
    auto info = LoadModelInfo(**src);
    EXPECT_TRUE(info.ok());
    auto names = StageTensorNames(info->spec, 2, 4, false);
    EXPECT_TRUE(FetchTensors(**src, info->index, names, [](const TensorInfo&, std::span<const float>) {
                  return Status::Ok();
                }).ok());
  };
  fetch();
  const int weight_requests = static_cast<int>(FileRequests("model.safetensors"));
  EXPECT_GE(weight_requests, 1);
  hub_->ResetCounters();
  fetch();
  EXPECT_EQ(FileRequests("model.safetensors"), 0u) << "the slice and the header came from the cache";
}

TEST_F(HubE2E, TheTokenNeverAppearsInOutputAndNeverReachesTheRedirectHost) {
  hub_->Gate("acme/stories");
  hub_->SetToken(kToken);
  hub_->SetRedirectAbove(100'000);  // model.safetensors goes to the "CDN"
  auto none = Cli("inspect --model acme/stories");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("accept the licence"), std::string::npos) << none.err;
  auto wrong = Cli("inspect --model acme/stories", "hf_wrongWrongWrong123");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_EQ(wrong.err.find("hf_wrongWrongWrong123"), std::string::npos) << wrong.err;
  EXPECT_EQ(wrong.out.find("hf_wrongWrongWrong123"), std::string::npos);
  auto ok = Cli("inspect --model acme/stories --devices 2", kToken);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out.find(kToken), std::string::npos);
  EXPECT_EQ(ok.err.find(kToken), std::string::npos);
  EXPECT_FALSE(hub_->cdn_saw_authorization());
  bool cdn_used = false;
  for (const auto& r : hub_->requests()) cdn_used = cdn_used || r.server == "cdn";
  EXPECT_TRUE(cdn_used);
  // Nothing the project wrote holds the token.
  for (const auto& e : fs::recursive_directory_iterator(tmp_ / "cache")) {
    if (!e.is_regular_file()) continue;
    EXPECT_EQ(e2e::ReadAll(e.path().string()).find(kToken), std::string::npos) << e.path();
  }
}

TEST_F(HubE2E, CraftedIdsAreRefusedBeforeAnyRequest) {
  for (const char* id : {"a/b/c", "a/b?x=1", "a%2Fb", "a/", "/b", "a//b", "acme/stories@../x"}) {
    hub_->ResetCounters();
    auto r = Cli(std::string("inspect --model '") + id + "'");
    EXPECT_NE(r.exit_code, 0) << id;
    EXPECT_EQ(hub_->request_count(), 0) << id;
  }
}

TEST_F(HubE2E, ARangeIgnoringServerIsRefused) {
  hub_->SetIgnoreRanges(true);
  auto r = Cli("inspect --model acme/stories");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("the server ignored the byte range"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace daisy

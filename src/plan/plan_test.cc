#include "daisy/plan.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>

namespace daisy {
namespace {

constexpr uint64_t kGB = 1ull << 30;

DeviceReport Dev(std::string id, double cap, uint64_t mem, uint64_t probe = 7) {
  return DeviceReport{id, "dev-" + id, cap, mem, probe, "scalar"};
}

PlanModel Model(int layers, uint64_t layer_bytes = 100, uint64_t head_bytes = 1000) {
  return PlanModel{layers, layer_bytes, head_bytes, 1.0};
}

std::vector<int> Counts(const Plan& p) {
  std::vector<int> c;
  for (const auto& s : p.stages) c.push_back(s.end - s.first);
  return c;
}

TEST(Plan, StaysOnTheHeadWhenItCanHoldEverything) {
  auto p = MakePlan(Model(30), {Dev("head", 10, kGB), Dev("b", 10, kGB)}, {});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(Counts(*p), std::vector<int>({30}));
}

TEST(Plan, LargestRemainderOfCapacityWithTheHeadFirstThenById) {
  PlanOptions o;
  // Given out of order: the plan orders non-head devices by id. The head cannot hold all
  // ten layers (1000 + 9 x 100 bytes), so every device takes part.
  auto p = MakePlan(Model(10), {Dev("head", 1, 1950), Dev("z", 2, kGB), Dev("a", 1, kGB)}, o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  // Shares 2.5, 2.5, 5: floors 2, 2, 5 and the one left goes to the first largest remainder.
  EXPECT_EQ(Counts(*p), std::vector<int>({3, 2, 5}));
  EXPECT_EQ(p->stages[1].device_id, "a");
  EXPECT_EQ(p->stages[2].device_id, "z");
  EXPECT_EQ(p->stages[2].end, 10);
  EXPECT_TRUE(ValidateAssignment(*p, 10, "head").ok());
}

TEST(Plan, AskedForStagesEveryStageGetsALayerEvenWhenSlow) {
  PlanOptions o;
  o.stages = 3;
  // The head is 100x faster: by capacity alone it would take everything and drop the others.
  auto p = MakePlan(Model(5, 100, 1000), {Dev("head", 100, 1100), Dev("b", 1, kGB), Dev("c", 1, kGB)}, o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(Counts(*p), std::vector<int>({1, 2, 2}));  // the head's memory holds one layer
  auto q = MakePlan(Model(5), {Dev("head", 100, kGB), Dev("b", 1, kGB), Dev("c", 1, kGB)}, o);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(Counts(*q), std::vector<int>({3, 1, 1}));
  o.stages = 7;
  std::vector<DeviceReport> many = {Dev("head", 1, kGB)};
  for (int i = 0; i < 6; ++i) many.push_back(Dev(std::string(1, static_cast<char>('a' + i)), 1, kGB));
  EXPECT_FALSE(MakePlan(Model(5), many, o).ok());
}

TEST(Plan, CappedByMemoryAndTheRestShared) {
  PlanOptions o;
  o.stages = 3;
  // "b" is fast but holds only 2 layers; the others take what it cannot.
  auto p = MakePlan(Model(12, 100, 1000), {Dev("head", 1, kGB), Dev("b", 100, 250), Dev("c", 1, kGB)}, o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(Counts(*p), std::vector<int>({5, 2, 5}));
  // Nothing fits: a clear refusal.
  auto none = MakePlan(Model(12, 100, 1000), {Dev("head", 1, 1100), Dev("b", 1, 250)}, o = PlanOptions{});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("does not fit"), std::string::npos) << none.status().message();
}

TEST(Plan, LeavesOutAProbeMismatchAndDropsDevicesWithoutLayers) {
  PlanOptions o;
  auto p =
      MakePlan(Model(4, 100, 1000), {Dev("head", 1, 1100), Dev("b", 1, kGB, 8), Dev("c", 1, kGB), Dev("d", 0, kGB)}, o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(Counts(*p), std::vector<int>({1, 3}));
  EXPECT_EQ(p->stages[1].device_id, "c");
  ASSERT_EQ(p->notes.size(), 2u);
  EXPECT_NE(p->notes[0].find("probe hash differs"), std::string::npos);
  EXPECT_NE(p->notes[1].find("dropped dev-d"), std::string::npos);
}

TEST(Plan, ExplicitLayerCountsIncludingAHeadWithNoLayers) {
  PlanOptions o;
  o.layer_counts = std::vector<int>{0, 15, 15};
  auto p = MakePlan(Model(30), {Dev("head", 1, kGB), Dev("b", 1, kGB), Dev("c", 1, kGB)}, o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(Counts(*p), std::vector<int>({0, 15, 15}));
  o.layer_counts = std::vector<int>{10, 10};
  EXPECT_FALSE(MakePlan(Model(30), {Dev("head", 1, kGB), Dev("b", 1, kGB)}, o).ok());
  o.layer_counts = std::vector<int>{10, 0, 20};
  EXPECT_FALSE(MakePlan(Model(30), {Dev("head", 1, kGB), Dev("b", 1, kGB), Dev("c", 1, kGB)}, o).ok());
}

TEST(Plan, StopsBeforeAnyDownloadWhenTooSlow) {
  PlanModel m = Model(30);
  m.layer_cost_gemms = 1000;  // 30,000 reference GEMMs per token on a device doing 100/s: 300 s
  auto p = MakePlan(m, {Dev("head", 100, kGB)}, {});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("estimated time per token is 300.0 s"), std::string::npos)
      << p.status().message();
}

TEST(Plan, SpecSizesGrowWithTheModelAndTheContext) {
  ModelSpec s;
  s.n_layers = 30, s.hidden = 576, s.n_heads = 9, s.n_kv_heads = 3, s.head_dim = 64, s.intermediate = 1536,
  s.vocab = 49152;
  PlanModel m = PlanModelFromSpec(s, 0);
  // Weights of one SmolLM-135M layer: 576*(576+2*192) + 576*576 + 3*1536*576 int8 bytes.
  const uint64_t weights = 576ull * 960 + 576ull * 576 + 3ull * 1536 * 576;
  EXPECT_GT(m.layer_bytes, weights);
  EXPECT_LT(m.layer_bytes, weights + weights / 50);
  EXPECT_GT(PlanModelFromSpec(s, 4096).layer_bytes, m.layer_bytes + 4096ull * 2 * 192);
}

// A ring for a model no device holds: 12 layers of 100 MB, a head's tensors of 300 MB and
// 100 MB of working memory per device; budgets of 700 MB each hold 3 (head) or 6 layers.
TEST(Plan, BudgetsCapEveryDeviceCountingWorkingMemory) {
  constexpr uint64_t kMB = 1000000;
  PlanModel m{12, 100 * kMB, 300 * kMB, 1.0, 100 * kMB};
  const std::vector<DeviceReport> devices = {Dev("head", 10, 700 * kMB), Dev("a", 10, 700 * kMB),
                                             Dev("b", 10, 700 * kMB)};
  for (const auto& d : devices)
    EXPECT_LT(d.free_memory, m.Need(m.n_layers, false)) << "no device holds the model alone";
  auto p = MakePlan(m, devices, {});
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(Counts(*p), std::vector<int>({3, 5, 4}));  // shares of 4 each; the head's budget caps it at 3
  for (const auto& s : p->stages) {
    EXPECT_LE(s.need_bytes, s.budget_bytes) << s.device_id;
    EXPECT_EQ(s.budget_bytes, 700 * kMB);
    EXPECT_EQ(s.need_bytes, s.hold_bytes + 100 * kMB);
  }
  EXPECT_EQ(p->stages[0].need_bytes, 3 * 100 * kMB + 300 * kMB + 100 * kMB);
}

TEST(Plan, NoPlanFitsTheBudgetsNamesTheShortfall) {
  constexpr uint64_t kMB = 1000000;
  PlanModel m{12, 100 * kMB, 300 * kMB, 1.0, 100 * kMB};
  // Room for 3 + 4 + 4 = 11 layers of 12: need 1.2 G + 300 M + 3 x 100 M = 1.8 GB, budgets 1.7 GB.
  auto p = MakePlan(m, {Dev("head", 10, 700 * kMB), Dev("a", 10, 500 * kMB), Dev("b", 10, 500 * kMB)}, {});
  ASSERT_FALSE(p.ok());
  const std::string& msg = p.status().message();
  EXPECT_NE(msg.find("the model does not fit in the devices' memory budgets"), std::string::npos) << msg;
  EXPECT_NE(msg.find("short by 95.4 MiB, 1 layer(s) without a place"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dev-a 476.8 MiB (room for 4 layers)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("before any download"), std::string::npos) << msg;
  // The same with --stages and --plan.
  PlanOptions o;
  o.stages = 3;
  EXPECT_NE(MakePlan(m, {Dev("head", 10, 700 * kMB), Dev("a", 10, 500 * kMB), Dev("b", 10, 500 * kMB)}, o)
                .status()
                .message()
                .find("short by"),
            std::string::npos);
  o.stages.reset();
  o.layer_counts = std::vector<int>{3, 5, 4};
  auto q = MakePlan(m, {Dev("head", 10, 700 * kMB), Dev("a", 10, 500 * kMB), Dev("b", 10, 500 * kMB)}, o);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find(
                "--plan gives 5 layers to dev-a, which need 572.2 MiB but its memory budget is 476.8 MiB"),
            std::string::npos)
      << q.status().message();
  // A head that cannot hold even its own tensors.
  auto h = MakePlan(m, {Dev("head", 10, 350 * kMB), Dev("a", 10, kGB)}, {});
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("memory budget of 333.8 MiB but needs 381.5 MiB before any layer"),
            std::string::npos)
      << h.status().message();
}

TEST(Plan, TheEmbeddingCountsAtTheWidthItIsHeld) {
  ModelSpec s;
  s.n_layers = 2, s.hidden = 64, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 16, s.intermediate = 128, s.vocab = 1000;
  // An F32 file keeps the embedding at 4 bytes per value: 2 more than BF16 per value.
  EXPECT_EQ(PlanModelFromSpec(s, 64, 4).head_bytes - PlanModelFromSpec(s, 64, 2).head_bytes, 2ull * 1000 * 64);
  // Working memory grows with the context (attention scores) and is at least the process's.
  EXPECT_GT(PlanModelFromSpec(s, 4096).working_bytes, PlanModelFromSpec(s, 64).working_bytes);
  EXPECT_GE(PlanModelFromSpec(s, 64).working_bytes, kProcessBytes);
}

Plan PlanOf(std::vector<std::pair<int, int>> ranges) {
  Plan p;
  int i = 0;
  for (auto [f, e] : ranges) p.stages.push_back({i == 0 ? "head" : "d" + std::to_string(i), "", f, e, 0}), ++i;
  return p;
}

TEST(ValidateAssignment, RefusesGapsOverlapsAndAForeignStageZero) {
  EXPECT_TRUE(ValidateAssignment(PlanOf({{0, 10}, {10, 20}, {20, 30}}), 30, "head").ok());
  EXPECT_TRUE(ValidateAssignment(PlanOf({{0, 0}, {0, 15}, {15, 30}}), 30, "head").ok());
  Status gap = ValidateAssignment(PlanOf({{0, 10}, {11, 30}}), 30, "head");
  EXPECT_NE(gap.message().find("layers 10..11 are not covered"), std::string::npos) << gap.message();
  Status twice = ValidateAssignment(PlanOf({{0, 10}, {9, 30}}), 30, "head");
  EXPECT_NE(twice.message().find("covered twice"), std::string::npos) << twice.message();
  EXPECT_FALSE(ValidateAssignment(PlanOf({{0, 10}, {10, 29}}), 30, "head").ok());
  EXPECT_FALSE(ValidateAssignment(PlanOf({{0, 10}, {10, 10}, {10, 30}}), 30, "head").ok());
  Status foreign = ValidateAssignment(PlanOf({{0, 30}}), 30, "someone-else");
  EXPECT_NE(foreign.message().find("not the head"), std::string::npos);
  Plan dup = PlanOf({{0, 10}, {10, 30}});
  dup.stages[1].device_id = "head";
  EXPECT_FALSE(ValidateAssignment(dup, 30, "head").ok());
}

using RouteFn = std::function<Result<Hop>(const Plan&, int)>;

// Walks one lap from stage 0 and returns the stages visited, or an error when the walk
// revisits a stage or does not end at RETURN.
Result<std::vector<int>> WalkLap(const Plan& plan, const RouteFn& route) {
  std::vector<int> visited = {0};
  std::set<int> seen = {0};
  int at = 0;
  for (size_t hops = 0; hops <= plan.stages.size(); ++hops) {
    auto hop = route(plan, at);
    if (!hop.ok()) return hop.status();
    if (hop->to_return) return visited;
    if (!seen.insert(hop->stage).second)
      return Aborted("stage " + std::to_string(hop->stage) + " visited twice in one lap");
    visited.push_back(hop->stage);
    at = hop->stage;
  }
  return Aborted("the lap never reached RETURN");
}

TEST(Route, EveryLapVisitsEachStageOnceAndEndsAtTheHeadsReturnAddress) {
  for (int n = 1; n <= 6; ++n) {
    std::vector<std::pair<int, int>> r;
    for (int i = 0; i < n; ++i) r.push_back({i, i + 1});
    Plan p = PlanOf(r);
    auto lap = WalkLap(p, Route);
    ASSERT_TRUE(lap.ok()) << lap.status().message();
    std::vector<int> want(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) want[static_cast<size_t>(i)] = i;
    EXPECT_EQ(*lap, want);
    EXPECT_EQ(Route(p, n - 1)->stage, kReturnAddress);
  }
  EXPECT_FALSE(Route(PlanOf({{0, 1}}), 1).ok());
  EXPECT_FALSE(Route(PlanOf({{0, 1}}), -1).ok());
}

TEST(Route, TheWalkCatchesTheOldBugWhereStageZeroMeantBothStartAndEnd) {
  // The original system sent the last stage's output to "index 0", which also meant "start
  // a lap": the walk must reject it.
  RouteFn old_bug = [](const Plan& p, int from) -> Result<Hop> {
    return Hop{false, (from + 1) % static_cast<int>(p.stages.size())};
  };
  for (int n = 1; n <= 4; ++n) {
    std::vector<std::pair<int, int>> r;
    for (int i = 0; i < n; ++i) r.push_back({i, i + 1});
    EXPECT_FALSE(WalkLap(PlanOf(r), old_bug).ok()) << n;
  }
}

}  // namespace
}  // namespace daisy

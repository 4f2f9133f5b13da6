// A decode lap on the head allocates nothing (issue 13: "no per-token allocation"): this
// binary replaces the global operator new with one that counts, and counts what a run makes
// from its first decode step to its last. Greedy and seeded top-k / top-p sampling, one thread and three
// (three: a decode step past kDecodeSplitMinKeys keys splits its attention across the pool),
// a Llama and a GPT-2 shape. Drafting is off: a lookahead lap builds its drafts' list.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "daisy/forward.h"
#include "daisy/generator.h"
#include "daisy/kernels.h"
#include "daisy/model.h"
#include "test_models.h"

namespace {
std::atomic<long> g_allocations{0};

void* Allocate(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void* AllocateAligned(size_t n, std::align_val_t a) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const size_t align = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(size_t n) {
  return Allocate(n);
}
void* operator new[](size_t n) {
  return Allocate(n);
}
void* operator new(size_t n, std::align_val_t a) {
  return AllocateAligned(n, a);
}
void* operator new[](size_t n, std::align_val_t a) {
  return AllocateAligned(n, a);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace daisy {
namespace {

constexpr int kTokens = 48;

// Allocations made between one Generate's second decode step and its last (kTokens - 2
// laps of the head, each after sampling a token; the first lap sizes the turn's own
// buffers), and the ids it chose.
long DecodeAllocations(Generator& gen, const std::vector<int32_t>& prompt, GenerateOptions o,
                       std::vector<int32_t>* ids) {
  o.max_tokens = kTokens;
  o.stop_ids.clear();  // every run decodes all its tokens
  long first = -1, last = -1;
  int steps = 0;
  o.on_step = [&](int, std::span<const float>, std::span<const float>) {
    last = g_allocations.load();
    if (++steps == 2) first = last;
  };
  auto r = gen.Generate(prompt, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) *ids = r->ids;
  return last - first;
}

// On one thread every run after the first allocates nothing while it decodes. On several,
// a pool thread's own buffers grow the first time it takes a larger piece of work, which
// depends on which thread claims which task: such growth is bounded over the process's
// life, so some run of a few allocates nothing, and none makes one per lap.
void ExpectNoAllocationPerToken(const ModelSpec& spec, int threads) {
  kernels::SetThreads(threads);
  auto pipeline = LocalPipeline::FromTensors(spec, testing::RandomTensors(spec, 7), std::vector<int>{spec.n_layers},
                                             /*ctx=*/256);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().ToString();
  Generator gen(pipeline->head());
  // Past kDecodeSplitMinKeys keys from the first decode step.
  std::vector<int32_t> prompt(kDecodeSplitMinKeys + 6);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((3 + 13 * i) % spec.vocab);
  SamplingParams greedy, seeded;
  seeded.temperature = 0.9f;
  seeded.top_k = 40;
  seeded.top_p = 0.95f;
  seeded.seed = 11;
  for (const SamplingParams& sampling : {greedy, seeded}) {
    SCOPED_TRACE(sampling.temperature > 0 ? "seeded" : "greedy");
    GenerateOptions o;
    o.sampling = sampling;
    std::vector<int32_t> first_ids, ids;
    DecodeAllocations(gen, prompt, o, &first_ids);  // sizes the buffers the later runs reuse
    ASSERT_EQ(first_ids.size(), static_cast<size_t>(kTokens));
    const int runs = threads == 1 ? 2 : 6;
    long fewest = -1;
    for (int run = 0; run < runs; ++run) {
      const long made = DecodeAllocations(gen, prompt, o, &ids);
      EXPECT_EQ(ids, first_ids) << "the same run gave other ids";
      EXPECT_LT(made, kTokens - 2) << "run " << run << ": " << made << " allocations in " << (kTokens - 2)
                                   << " decode laps";
      if (threads == 1) {
        EXPECT_EQ(made, 0) << "run " << run << " allocated while decoding";
      }
      fewest = fewest < 0 ? made : std::min(fewest, made);
    }
    EXPECT_EQ(fewest, 0) << "every one of " << runs << " runs allocated while decoding";
  }
  kernels::SetThreads(1);
}

TEST(DecodeAllocations, NonePerTokenOnOneThread) {
  ExpectNoAllocationPerToken(testing::TinyLlamaSpec(3), 1);
  ExpectNoAllocationPerToken(testing::TinyGpt2Spec(2), 1);
}

TEST(DecodeAllocations, NonePerTokenWithAttentionSplitAcrossThreeThreads) {
  ExpectNoAllocationPerToken(testing::TinyLlamaSpec(3), 3);
  ExpectNoAllocationPerToken(testing::TinyGpt2Spec(2), 3);
}

}  // namespace
}  // namespace daisy

// Tests only: the faults a test makes a ring member commit (NodeFaults, daisy/node.h): a
// slow stage and a stage that lies by one bit. Linked into test binaries and into the
// test-only daisychain_faulty executable, never into daisychain.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "daisy/node.h"

namespace daisy::test {

// Thread-safe (one device's hops come from one thread; the counter is atomic anyway).
class TestNodeFaults final : public NodeFaults {
 public:
  // flip_every: flip the lowest mantissa bit of the first value of every Nth hop's output
  // (a one-ulp lie; 0 = never). hop_delay_ms: sleep this long in every hop (a slow stage
  // makes "kill it mid-turn" deterministic; 0 = never).
  // Where the flip of a rigged hop goes: into the output before anything is said about it
  // (a consistent liar, caught by the re-run), after its honest digest went to the head, or
  // after an honest-looking receipt went to the next stage too (audited turns only).
  enum class Lie { kInOutput, kAfterReport, kAfterReceipt };
  TestNodeFaults(int flip_every, int hop_delay_ms, Lie lie = Lie::kInOutput)
      : flip_every_(flip_every), hop_delay_ms_(hop_delay_ms), lie_(lie) {}
  // From DAISY_TEST_FLIP_EVERY and DAISY_TEST_HOP_DELAY_MS; null when neither is set above 0.
  static std::unique_ptr<TestNodeFaults> FromEnvironment();

  std::string Describe() const override;
  void OnHopOutput(std::vector<float>& values) override;
  void AfterReport(std::vector<float>& values) override;
  void AfterReceipt(std::vector<float>& values) override;

 private:
  const int flip_every_;
  const int hop_delay_ms_;
  const Lie lie_;
  bool Rigged(int64_t n) const { return flip_every_ > 0 && n % flip_every_ == 0; }
  void Flip(std::vector<float>& values, Lie at) const;
  std::atomic<int64_t> hops_{0};
};

}  // namespace daisy::test

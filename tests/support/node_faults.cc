#include "node_faults.h"

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>

namespace daisy::test {

std::unique_ptr<TestNodeFaults> TestNodeFaults::FromEnvironment() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : 0;
  };
  const int flip = env("DAISY_TEST_FLIP_EVERY"), delay = env("DAISY_TEST_HOP_DELAY_MS");
  if (flip <= 0 && delay <= 0) return nullptr;
  return std::make_unique<TestNodeFaults>(flip, delay);
}

std::string TestNodeFaults::Describe() const {
  std::string s;
  if (flip_every_ > 0)
    s += "flipping a bit of every " + std::to_string(flip_every_) + "-th hop's output" +
         (lie_ == Lie::kAfterReport    ? " after reporting its honest digest"
          : lie_ == Lie::kAfterReceipt ? " after its honest digest and receipt"
                                       : "");
  if (hop_delay_ms_ > 0)
    s += std::string(s.empty() ? "" : "; ") + "delaying every hop by " + std::to_string(hop_delay_ms_) + " ms";
  return s;
}

void TestNodeFaults::Flip(std::vector<float>& values, Lie at) const {
  if (lie_ != at || !Rigged(hops_.load()) || values.empty()) return;
  const uint32_t bits = std::bit_cast<uint32_t>(values[0]);
  values[0] = std::bit_cast<float>(bits ^ 1u);  // the lowest mantissa bit: a one-ulp lie
}

void TestNodeFaults::OnHopOutput(std::vector<float>& values) {
  if (hop_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hop_delay_ms_));
  ++hops_;
  Flip(values, Lie::kInOutput);
}
void TestNodeFaults::AfterReport(std::vector<float>& values) {
  Flip(values, Lie::kAfterReport);
}
void TestNodeFaults::AfterReceipt(std::vector<float>& values) {
  Flip(values, Lie::kAfterReceipt);
}

}  // namespace daisy::test

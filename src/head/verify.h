// Verify: the turn again on one device, compared with the ring's step by step. Ids alone
// miss a lie small enough to keep the argmax, so each step is compared by BLAKE2b-256 of the
// final hidden row the token was read out from and of its logits.
#pragma once

#include <span>
#include <vector>

#include "daisy/generator.h"
#include "daisy/head.h"
#include "daisy/wire.h"

namespace daisy::head {

// One step of a run as Verify compares it: each digest over f32 bytes in memory
// (little-endian on every host the kernels support).
struct StepDigest {
  wire::Digest row{};
  wire::Digest logits{};
};

// Adds digesting every step into `steps` to the options (after any hook already there).
void DigestSteps(GenerateOptions& g, std::vector<StepDigest>& steps);

// Verify's verdict: the distributed run (ids a, digests da) against the single-device run
// (ids b, digests db), step by step; the first step where the ids or the bits differ wins.
void Compare(HeadReport& report, std::span<const int32_t> a, std::span<const StepDigest> da, std::span<const int32_t> b,
             std::span<const StepDigest> db);

// The rest of the model for a Verify that never holds it: the hidden states after the last
// layer of every position of the turn, computed beforehand slice by slice. The head's own
// layers run live; a batch whose input rows are not the ones the slices were computed from
// (the single-device run chose another token) ends the run as diverged.
class ReplayLink final : public StageLink {
 public:
  ReplayLink(const std::vector<float>& in, const std::vector<float>& out, int hidden)
      : in_(in), out_(out), hidden_(hidden) {}
  Result<HiddenStates> Run(HiddenStates h) override;
  bool diverged() const { return diverged_; }

 private:
  const std::vector<float>& in_;
  const std::vector<float>& out_;
  int hidden_;
  bool diverged_ = false;
};

}  // namespace daisy::head

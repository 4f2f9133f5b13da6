// daisychain_faulty only (a test build): faults from DAISY_TEST_FLIP_EVERY and
// DAISY_TEST_HOP_DELAY_MS.
#include "faults.h"
#include "node_faults.h"

namespace daisy::cli {

NodeFaults* ProcessNodeFaults() {
  static const std::unique_ptr<test::TestNodeFaults> faults = test::TestNodeFaults::FromEnvironment();
  return faults.get();
}

}  // namespace daisy::cli

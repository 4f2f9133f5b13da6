// The fault injection the nodes of this executable run with (NodeFaults, daisy/node.h).
// daisychain links faults/none.cc: none, whatever the environment says. The test-only
// daisychain_faulty links faults/from_env.cc instead: DAISY_TEST_FLIP_EVERY and
// DAISY_TEST_HOP_DELAY_MS, for the multi-process tests that need a slow or lying stage.
#pragma once

#include "daisy/node.h"

namespace daisy::cli {

// Null in the product. Made once, lives as long as the process; thread-safe.
NodeFaults* ProcessNodeFaults();

}  // namespace daisy::cli

// The product: no fault injection, and no code that reads the test variables.
#include "faults.h"

namespace daisy::cli {

NodeFaults* ProcessNodeFaults() {
  return nullptr;
}

}  // namespace daisy::cli

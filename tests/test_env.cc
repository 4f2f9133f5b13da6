// Linked into every test binary: gives the tests the paths of the source tree and the
// build tree through the environment (DAISY_TESTDATA, DAISY_MODELS, DAISY_BIN_DIR,
// DAISY_SOURCE_DIR), unless the caller already set them. Done here rather than with
// CTest's ENVIRONMENT property, which gtest_discover_tests cannot pass as a list.
#include <cstdlib>

namespace {
struct TestEnv {
  TestEnv() {
    ::setenv("DAISY_TESTDATA", DAISY_TEST_TESTDATA, 0);
    ::setenv("DAISY_MODELS", DAISY_TEST_MODELS, 0);
    ::setenv("DAISY_BIN_DIR", DAISY_TEST_BIN_DIR, 0);
    ::setenv("DAISY_SOURCE_DIR", DAISY_TEST_SOURCE_DIR, 0);
  }
} const kTestEnv;
}  // namespace

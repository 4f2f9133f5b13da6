// Helpers for tests that run the real daisychain binary as a child process.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace daisy::e2e {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string Bin() { return std::string(std::getenv("DAISY_BIN_DIR")) + "/apps/cli/daisychain"; }
// The test-only build of the same commands whose nodes obey DAISY_TEST_FLIP_EVERY and
// DAISY_TEST_HOP_DELAY_MS (apps/cli/faults): for tests that need a slow or lying stage.
inline std::string FaultyBin() { return std::string(std::getenv("DAISY_BIN_DIR")) + "/apps/cli/daisychain_faulty"; }
inline std::string Models() { return std::getenv("DAISY_MODELS"); }

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `env_prefix daisychain args` through the shell with stdin closed; `scratch` is a
// folder for the captured output.
inline RunResult RunCli(const std::string& env_prefix, const std::string& args, const std::string& scratch) {
  const std::string out = scratch + "/stdout.txt", err = scratch + "/stderr.txt";
  const std::string cmd = "env " + env_prefix + " " + Bin() + " " + args + " > " + out + " 2> " + err + " < /dev/null";
  int rc = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = ReadAll(out);
  r.err = ReadAll(err);
  return r;
}

}  // namespace daisy::e2e

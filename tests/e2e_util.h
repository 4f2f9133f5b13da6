// Helpers for tests that run the real daisychain binary as a child process.
#pragma once

#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace daisy::e2e {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string Bin() {
  return std::string(std::getenv("DAISY_BIN_DIR")) + "/apps/cli/daisychain";
}
// The test-only build of the same commands whose nodes obey DAISY_TEST_FLIP_EVERY and
// DAISY_TEST_HOP_DELAY_MS (apps/cli/faults): for tests that need a slow or lying stage.
inline std::string FaultyBin() {
  return std::string(std::getenv("DAISY_BIN_DIR")) + "/apps/cli/daisychain_faulty";
}
inline std::string Models() {
  return std::getenv("DAISY_MODELS");
}

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

// The admin secret of a `serve` whose stderr goes to `log_path`, as its operator gets it:
// from the web UI's URL it prints ("web UI: http://HOST:PORT/?token=SECRET"). Waits up to
// 20 s for the line; "" when it never came.
inline std::string AdminSecretFromLog(const std::string& log_path) {
  const std::string mark = "/?token=";
  for (int i = 0; i < 400; ++i) {
    const std::string log = ReadAll(log_path);
    const size_t at = log.find(mark);
    if (at != std::string::npos) {
      const size_t end = log.find_first_of(" \n", at);
      if (end != std::string::npos) return log.substr(at + mark.size(), end - at - mark.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

}  // namespace daisy::e2e

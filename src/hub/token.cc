#include "token.h"

#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "daisy/log.h"

namespace daisy::hub {
namespace {

std::string TrimToken(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string EnvOr(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string TokenFilePath() {
  if (std::string p = EnvOr("HF_TOKEN_PATH"); !p.empty()) return p;
  if (std::string h = EnvOr("HF_HOME"); !h.empty()) return h + "/token";
  if (std::string home = EnvOr("HOME"); !home.empty()) return home + "/.cache/huggingface/token";
  return "";
}

}  // namespace

Status CheckTokenChars(std::string_view token) {
  for (char c : token) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f)
      return InvalidArgument("the Hugging Face token contains spaces or control characters; refusing to send it");
  }
  return Status::Ok();
}

std::optional<std::string> TokenFromEnvironment() {
  std::string token = TrimToken(EnvOr("HF_TOKEN"));
  if (!token.empty()) {
    RegisterSecret(token);
    return token;
  }
  std::string path = TokenFilePath();
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  token = TrimToken(ss.str());
  if (token.empty()) return std::nullopt;
  RegisterSecret(token);
  LogDebug("using the Hugging Face token from " + path);
  return token;
}

std::optional<std::string> PromptForToken(std::string_view why) {
  if (!::isatty(STDIN_FILENO)) return std::nullopt;
  // Echo goes off before the prompt appears (as getpass does): TCSAFLUSH drops what was
  // typed earlier, so nothing typed after the prompt can be lost or echoed.
  termios saved{};
  bool restore = ::tcgetattr(STDIN_FILENO, &saved) == 0;
  if (restore) {
    termios quiet = saved;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    quiet.c_lflag |= ECHONL;
    ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
  }
  std::fprintf(stderr, "%.*s\nHugging Face token (input hidden, empty to give up): ", static_cast<int>(why.size()),
               why.data());
  std::fflush(stderr);
  std::string line;
  char buf[512];
  while (std::fgets(buf, sizeof buf, stdin) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') break;
  }
  if (restore) ::tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved);
  std::string token = TrimToken(line);
  if (token.empty()) return std::nullopt;
  RegisterSecret(token);
  return token;
}

}  // namespace daisy::hub

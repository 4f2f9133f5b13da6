// The cache of per-shape timings behind the backend choice (docs/KERNELS.md, "Selection"):
// one small JSON file in DAISY_HOME, valid only for the CPU model and kernel version that
// wrote it. Compiled without ISA flags.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "internal.h"

namespace daisy::kernels::internal {
namespace {

constexpr int kFormat = 1;

std::string_view ShapeKey(int s) {
  return ProductShapeName(static_cast<ProductShape>(s));
}

}  // namespace

std::string ChoiceCachePath() {
  std::string home;
  if (const char* h = std::getenv("DAISY_HOME"); h && *h)
    home = h;
  else if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x)
    home = std::string(x) + "/daisychain";
  else if (const char* u = std::getenv("HOME"); u && *u)
    home = std::string(u) + "/.config/daisychain";
  if (home.empty()) return "";
  // One file per CPU model (FNV-1a of its key), so machines sharing a home (or an emulator
  // run beside the host) do not overwrite each other's timings.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : CpuModelKey()) h = (h ^ c) * 0x100000001b3ULL;
  char name[64];
  std::snprintf(name, sizeof name, "/kernels-choice-%016llx.json", static_cast<unsigned long long>(h));
  return home + name;
}

std::string ReadChoiceCache(const std::string& path, std::span<const Backend> needed, ShapeTimings* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "no cache file";
  std::stringstream text;
  text << in.rdbuf();
  // The file is ours but may be truncated or edited: parse without exceptions.
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return "not valid JSON";
  auto int_field = [&](const char* key) -> int {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? it->get<int>() : -1;
  };
  if (int_field("format") != kFormat) return "unknown format";
  if (int_field("kernel_version") != kKernelVersion) return "written for another kernel version";
  const auto cpu = j.find("cpu");
  if (cpu == j.end() || !cpu->is_string() || cpu->get<std::string>() != CpuModelKey()) return "written on another CPU";
  const auto sec = j.find("seconds_per_product");
  if (sec == j.end() || !sec->is_object()) return "no seconds_per_product";
  ShapeTimings t{};
  for (int s = 0; s < kProductShapes; ++s) {
    const auto row = sec->find(std::string(ShapeKey(s)));
    if (row == sec->end() || !row->is_object()) return "no timings for " + std::string(ShapeKey(s));
    for (Backend b : needed) {
      const auto v = row->find(std::string(BackendName(b)));
      if (v == row->end() || !v->is_number() || !(v->get<double>() > 0) || !(v->get<double>() < 1e3))
        return "no valid timing of " + std::string(BackendName(b)) + " for " + std::string(ShapeKey(s));
      t[static_cast<size_t>(s)][static_cast<size_t>(b)] = v->get<double>();
    }
  }
  *out = t;
  return "";
}

std::string WriteChoiceCache(const std::string& path, const ShapeTimings& timings) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["kernel_version"] = kKernelVersion;
  j["cpu"] = CpuModelKey();
  nlohmann::ordered_json sec = nlohmann::ordered_json::object();
  for (int s = 0; s < kProductShapes; ++s) {
    nlohmann::ordered_json row = nlohmann::ordered_json::object();
    for (int b = 0; b < kBackendCount; ++b)
      if (timings[static_cast<size_t>(s)][static_cast<size_t>(b)] > 0)
        row[std::string(BackendName(static_cast<Backend>(b)))] =
            timings[static_cast<size_t>(s)][static_cast<size_t>(b)];
    sec[std::string(ShapeKey(s))] = row;
  }
  j["seconds_per_product"] = sec;
  std::error_code ec;
  const std::filesystem::path p(path);
  std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) return "cannot create " + p.parent_path().string() + ": " + ec.message();
  // A unique temporary name per process, then an atomic rename.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return "cannot write " + tmp;
    f << j.dump(2) << "\n";
    if (!f.flush()) return "cannot write " + tmp;
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return "cannot rename into " + path;
  }
  return "";
}

}  // namespace daisy::kernels::internal

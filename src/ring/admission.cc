// The device side of joining a room: the rendezvous's key (checked against --server-key or
// remembered on first use) and the host's approval of this device's key, over HTTP on the
// rendezvous's public port (GET /api/key, POST /api/join; docs/HTTP.md). Nothing here goes
// over ZeroMQ: the rendezvous admits a key only once it is approved.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "daisy/log.h"
#include "daisy/ring.h"

namespace daisy {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

using HttpReply = LanAnswer;

// One HTTP exchange (the Hub client's libcurl code); Unavailable when the server cannot be reached.
Result<HttpReply> Http(const std::string& url, const std::string* post_json) {
  return hub::LanExchange(url, post_json);
}

std::string ErrorMessage(const HttpReply& r) {
  Json j = Json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"];
  return "HTTP " + std::to_string(r.status);
}

bool Stopped(const JoinOptions& o) {
  return o.stop && o.stop->load();
}

void Sleep(const JoinOptions& o, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end && !Stopped(o)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// known_servers: one "HOST:PORT PUBLIC_KEY" per line.
std::map<std::string, std::string> ReadKnown(const fs::path& file) {
  std::map<std::string, std::string> out;
  std::ifstream in(file);
  std::string where, key;
  while (in >> where >> key) out[where] = key;
  return out;
}

Status Remember(const fs::path& file, const std::string& where, const std::string& key) {
  auto known = ReadKnown(file);
  known[where] = key;
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp);
    for (const auto& [w, k] : known) out << w << " " << k << "\n";
    if (!out) return Unavailable("cannot write " + file.string());
  }
  fs::rename(tmp, file, ec);
  if (ec) return Unavailable("cannot write " + file.string() + ": " + ec.message());
  return Status::Ok();
}

// The rendezvous's key against --server-key, or against the one remembered for this
// address (trust on first use).
Status CheckServerKey(const JoinOptions& o, const std::string& where, const std::string& key) {
  const std::string fpr = net::Fingerprint(key);
  const fs::path file = fs::path(o.home) / "known_servers";
  if (!o.server_fingerprint.empty()) {
    DAISY_ASSIGN_OR_RETURN(std::string want, net::NormalizeFingerprint(o.server_fingerprint));
    if (want.size() != 16)
      return InvalidArgument(
          "--server-key wants the whole fingerprint serve printed (16 hex digits like ab12-cd34-ef56-7890)");
    if (want != net::KeyId(key))
      return PermissionDenied("the server at " + where + " presents key fingerprint " + fpr + ", not the " +
                              o.server_fingerprint +
                              " given with --server-key: refusing to join (check the fingerprint "
                              "`daisychain serve` printed; someone may be between this device and the server)");
    return Remember(file, where, key);
  }
  const auto known = ReadKnown(file);
  auto it = known.find(where);
  if (it != known.end()) {
    if (it->second == key) return Status::Ok();
    return PermissionDenied("THE SERVER KEY CHANGED: the server at " + where + " now presents key fingerprint " + fpr +
                            ", but it presented " + net::Fingerprint(it->second) +
                            " when this device first joined it. Someone may be between this device and the "
                            "server. If the host really made a new key, compare " +
                            fpr +
                            " with the fingerprint `daisychain serve` prints, then "
                            "join with --server-key " +
                            fpr + " (or delete the line for " + where + " from " + file.string() + ")");
  }
  std::fprintf(stderr,
               "the server at %s has key fingerprint %s: compare it with the one `daisychain serve` printed "
               "(trusted from now on; --server-key %s checks it up front)\n",
               where.c_str(), fpr.c_str(), fpr.c_str());
  return Remember(file, where, key);
}

Result<net::JoinAnswer> AskOverHttp(const std::string& base, const net::JoinRequest& q) {
  const std::string body = Json{{"room", q.room}, {"public_key", q.public_key}, {"name", q.name}}.dump();
  DAISY_ASSIGN_OR_RETURN(HttpReply r, Http(base + "/api/join", &body));
  if (r.status == 429) return ResourceExhausted(ErrorMessage(r));
  if (r.status >= 500) return Unavailable(ErrorMessage(r));
  if (r.status != 200) return InvalidArgument("the server refused the join request: " + ErrorMessage(r));
  Json j = Json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("status") || !j["status"].is_string())
    return DataLoss("the server's answer to /api/join is not {\"status\": ...}");
  net::JoinAnswer a;
  a.approved = j["status"] == "approved";
  if (j.contains("fingerprint") && j["fingerprint"].is_string()) a.fingerprint = j["fingerprint"];
  return a;
}

}  // namespace

Result<std::string> AwaitAdmission(const JoinOptions& o, const net::KeyPair& keys) {
  const std::string mine = net::Fingerprint(keys.public_key);
  const std::string where = o.rendezvous.rfind("tcp://", 0) == 0 ? o.rendezvous.substr(6) : o.rendezvous;
  const std::string base = "http://" + where;
  const auto start = Clock::now();
  auto unreachable = [&](const Status& st) -> Status {
    if (o.unreachable_timeout_s > 0 &&
        std::chrono::duration<double>(Clock::now() - start).count() > o.unreachable_timeout_s)
      return Unavailable("cannot reach `daisychain serve` at " + where + ": " + st.message());
    return Status::Ok();
  };
  std::string server_key;
  if (o.admission) {
    server_key = o.admission->server_key;
  } else {
    bool said = false;
    while (server_key.empty()) {
      if (Stopped(o)) return Aborted("stopped before joining");
      auto r = Http(base + "/api/key", nullptr);
      if (r.ok() && r->status == 200) {
        Json j = Json::parse(r->body, nullptr, false);
        if (!j.is_object() || !j.contains("public_key") || !j["public_key"].is_string() ||
            !net::IsPublicKey(j["public_key"].get<std::string>()))
          return DataLoss("the server at " + where +
                          " answered /api/key without a CURVE public key: is it `daisychain serve`?");
        server_key = j["public_key"];
        break;
      }
      const Status st = r.ok() ? Unavailable(ErrorMessage(*r)) : r.status();
      if (r.ok() && r->status == 404)
        return NotFound("the server at " + where + " has no /api/key: is it `daisychain serve` of this version?");
      DAISY_RETURN_IF_ERROR(unreachable(st));
      if (!said) std::fprintf(stderr, "cannot reach %s yet (%s); trying again\n", where.c_str(), st.message().c_str());
      said = true;
      Sleep(o, 1.0);
    }
    DAISY_RETURN_IF_ERROR(CheckServerKey(o, where, server_key));
    std::fprintf(stderr, "this device's key fingerprint: %s\n", mine.c_str());
  }
  const net::JoinRequest q{o.room, keys.public_key, o.name, ""};
  bool told = false;
  auto last_told = Clock::now();
  while (!Stopped(o)) {
    auto a = o.admission ? o.admission->ask(q) : AskOverHttp(base, q);
    if (a.ok() && a->approved) {
      if (told) std::fprintf(stderr, "approved: %s joins room '%s'\n", mine.c_str(), o.room.c_str());
      return server_key;
    }
    if (a.ok()) {
      if (!told || Clock::now() - last_told > std::chrono::seconds(60)) {
        std::fprintf(stderr,
                     "waiting for the host to approve %s (on the serve terminal: approve %s, or the Approve button in "
                     "the web UI)\n",
                     mine.c_str(), mine.c_str());
        told = true;
        last_told = Clock::now();
      }
      Sleep(o, 1.0);
      continue;
    }
    const Status& st = a.status();
    if (st.code() == ErrorCode::kResourceExhausted) {
      std::fprintf(stderr, "the server says: %s\n", st.message().c_str());
      Sleep(o, 10.0);
    } else if (st.code() == ErrorCode::kUnavailable) {
      DAISY_RETURN_IF_ERROR(unreachable(st));
      Sleep(o, 1.0);
    } else {
      return st;
    }
  }
  return Aborted("stopped before the host approved this device");
}

}  // namespace daisy

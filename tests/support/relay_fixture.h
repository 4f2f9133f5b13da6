// Tests only: serve's one port in this process, for the relay's test (src/ring/relay_test.cc)
// and the tab link's (tests/link_test.cc). A DAISY_HOME under /tmp, a rendezvous whose relay
// hands every frame it forwards to Seen(), a PortMux in front of it, and RoomMembers joined
// through that port; plus activations whose bytes no ciphertext holds by chance.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daisy/net.h"
#include "daisy/ring.h"

namespace daisy::testrelay {

// A payload no ciphertext will contain by chance: 64 floats of a fixed pattern.
inline std::vector<float> Payload(float base) {
  std::vector<float> v(64);
  for (size_t i = 0; i < v.size(); ++i) v[i] = base + 0.015625f * static_cast<float>(i);
  return v;
}

inline wire::Activation ActivationOf(std::vector<float> values) {
  wire::Activation a;
  a.seq = 3;
  a.token_index = 5;
  a.next = 1;
  a.model_hash = 0x12345678u;
  a.values = std::move(values);
  a.act_hash = wire::ActHash(a.values);
  return a;
}

inline bool Holds(const std::vector<uint8_t>& hay, const uint8_t* needle, size_t n) {
  return std::search(hay.begin(), hay.end(), needle, needle + n) != hay.end();
}

// Fails for each 16-byte window of `payload` (one starting every `stride` bytes) that stands
// in one of `frames` (what the relay forwarded): it must see only ciphertext.
inline void ExpectInNoFrame(const std::vector<std::vector<uint8_t>>& frames, const std::vector<float>& payload,
                            size_t stride) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
  for (size_t at = 0; at + 16 <= payload.size() * 4; at += stride)
    for (const auto& frame : frames)
      EXPECT_FALSE(Holds(frame, bytes + at, 16))
          << "payload bytes [" << at << ", " << at + 16 << ") are in a frame the relay saw";
}

class RelayFixture : public ::testing::Test {
 protected:
  using Clock = std::chrono::steady_clock;

  void SetUp() override {
    char tmpl[] = "/tmp/daisy_relay_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    home_ = tmpl;
    ::setenv("DAISY_HOME", home_.c_str(), 1);
  }
  void TearDown() override {
    members_.clear();
    mux_.reset();
    rv_.reset();
    ::unsetenv("DAISY_HOME");
    std::error_code ec;
    std::filesystem::remove_all(home_, ec);
  }
  // The rendezvous, its relay's frames recorded; `tweak` sets anything else.
  void StartRendezvous(const std::function<void(net::RendezvousOptions&)>& tweak = {}) {
    net::RendezvousOptions ro;
    ro.port = 0;
    ro.relay_observer = [this](std::span<const uint8_t> frame) {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.emplace_back(frame.begin(), frame.end());
    };
    if (tweak) tweak(ro);
    auto rv = net::Rendezvous::Start(ro);
    ASSERT_TRUE(rv.ok()) << rv.status().message();
    rv_ = std::move(*rv);
  }
  // The port in front of the rendezvous: ZMTP to it, SOCKS5 to `relay_port` (0: refused), the
  // link's WebSocket to `link_port` and any other HTTP to `http_port` (0: to the rendezvous's
  // port, when nothing here speaks HTTP).
  void StartMux(int relay_port, int link_port = 0, int http_port = 0) {
    net::PortMuxOptions mo;
    mo.port = 0;
    mo.zmq_port = std::stoi(rv_->address().substr(rv_->address().rfind(':') + 1));
    mo.http_port = http_port ? http_port : mo.zmq_port;
    mo.relay_port = relay_port;
    mo.link_port = link_port;
    auto mux = net::PortMux::Start(mo);
    ASSERT_TRUE(mux.ok()) << mux.status().message();
    mux_ = std::move(*mux);
  }
  // A member that reaches the room through the mux, trusted by the rendezvous.
  RoomMember::Options MemberOptions(const std::string& role) const {
    RoomMember::Options o;
    o.role = role;
    o.name = role;
    o.log_name = role;
    o.rendezvous = "tcp://127.0.0.1:" + std::to_string(mux_->port());
    o.admission = rv_->LocalAdmission(/*trusted=*/true);
    o.capabilities = wire::kCapCompute;
    o.budget = 1ull << 30;
    return o;
  }
  RoomMember& Add(const RoomMember::Options& o) {
    auto m = RoomMember::Create(o);
    EXPECT_TRUE(m.ok()) << m.status().message();
    EXPECT_TRUE((*m)->Admit().ok());
    members_.push_back(std::move(*m));
    return *members_.back();
  }
  // The next frame `m` accepts within `ms` (peer lists skipped); nullopt when none.
  static std::optional<Incoming> Next(RoomMember& m, int ms) {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end) {
      auto in = m.Receive(50, 0, [](const std::string&) { return true; });
      if (!in.ok() || !in->has_value()) continue;
      if ((*in)->message.ok() && std::holds_alternative<wire::Peers>(*(*in)->message)) continue;
      return std::move(**in);
    }
    return std::nullopt;
  }
  // Every frame the relay forwarded so far.
  std::vector<std::vector<uint8_t>> Seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

  std::filesystem::path home_;
  std::unique_ptr<net::Rendezvous> rv_;
  std::unique_ptr<net::PortMux> mux_;
  std::vector<std::unique_ptr<RoomMember>> members_;
  std::mutex mu_;
  std::vector<std::vector<uint8_t>> seen_;
};

}  // namespace daisy::testrelay

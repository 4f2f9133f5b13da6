// PeerBoxes: the end-to-end box of a frame that crosses serve's relay. The relay ends one
// CurveZMQ link and starts another, so CURVE alone would show it the frame; the box is
// between the two members' long-term keys, which the relay does not hold.
#include "daisy/seal.h"

#include <sodium.h>

#include <bitset>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

namespace daisy::net {

static_assert(wire::kBoxMacBytes == crypto_box_MACBYTES, "the wire's least box is libsodium's MAC");

namespace {

bool DecodeKey(const std::string& z85, uint8_t out[32]) {
  std::array<uint8_t, 32> raw{};
  if (!Z85Decode(z85, raw)) return false;
  std::memcpy(out, raw.data(), raw.size());
  return true;
}

// 16 hex digits -> 8 bytes (the ids are checked by the wire decoder and made by KeyId).
void IdBytes(const std::string& id, uint8_t out[8]) {
  for (int i = 0; i < 8; ++i) {
    auto nibble = [](char c) { return static_cast<uint8_t>(c <= '9' ? c - '0' : c - 'a' + 10); };
    out[i] = static_cast<uint8_t>(nibble(id[2 * i]) << 4 | nibble(id[2 * i + 1]));
  }
}

// sender id | recipient id | counter (little-endian): unique per key and direction.
void Nonce(const std::string& from, const std::string& to, uint64_t counter, uint8_t nonce[crypto_box_NONCEBYTES]) {
  static_assert(crypto_box_NONCEBYTES == 24);
  IdBytes(from, nonce);
  IdBytes(to, nonce + 8);
  for (int i = 0; i < 8; ++i) nonce[16 + i] = static_cast<uint8_t>(counter >> (8 * i));
}

}  // namespace

struct PeerBoxes::Impl {
  KeyPair mine;
  std::string my_id;
  uint8_t secret[32] = {0};
  bool have_secret = false;
  uint64_t next_counter = 0;
  std::map<std::string, std::array<uint8_t, crypto_box_BEFORENMBYTES>> shared;  // by peer key
  // Per peer key: the highest counter opened, and which of the kReplayWindow below it were
  // (bit d: highest - d). A member's envelopes may come by two connections (its turn's and
  // its text's), so they need not arrive in counter order; each opens at most once.
  struct Seen {
    uint64_t highest = 0;
    std::bitset<kReplayWindow> opened;
  };
  std::map<std::string, Seen> seen;
  std::mutex mu;  // Seal and Open may be called from two threads (the turn's and the text's)

  ~Impl() { sodium_memzero(secret, sizeof secret); }

  Result<const uint8_t*> Shared(const std::string& peer) {
    auto it = shared.find(peer);
    if (it != shared.end()) return it->second.data();
    if (!have_secret) return InvalidArgument("Bug: PeerBoxes without a secret key");
    uint8_t pk[32];
    if (!DecodeKey(peer, pk)) return InvalidArgument("'" + peer.substr(0, 8) + "...' is not a CURVE public key");
    std::array<uint8_t, crypto_box_BEFORENMBYTES> k{};
    if (crypto_box_beforenm(k.data(), pk, secret) != 0)
      return InvalidArgument("the key " + Fingerprint(peer) + " is degenerate");
    return shared.emplace(peer, k).first->second.data();
  }
};

PeerBoxes::PeerBoxes(KeyPair mine) : impl_(std::make_unique<Impl>()) {
  [[maybe_unused]] static const int kSodiumReady = sodium_init();
  impl_->mine = std::move(mine);
  impl_->my_id = KeyId(impl_->mine.public_key);
  impl_->have_secret = DecodeKey(impl_->mine.secret_key, impl_->secret);
  impl_->next_counter = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

PeerBoxes::~PeerBoxes() = default;

uint64_t PeerBoxes::next_counter() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->next_counter;
}

Result<wire::Relay> PeerBoxes::Seal(const std::string& to_public, std::span<const uint8_t> frame) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  DAISY_ASSIGN_OR_RETURN(const uint8_t* key, impl_->Shared(to_public));
  wire::Relay env;
  env.to = KeyId(to_public);
  env.from = impl_->my_id;
  env.counter = impl_->next_counter++;
  uint8_t nonce[crypto_box_NONCEBYTES];
  Nonce(env.from, env.to, env.counter, nonce);
  env.box.resize(frame.size() + crypto_box_MACBYTES);
  crypto_box_easy_afternm(env.box.data(), frame.data(), frame.size(), nonce, key);
  return env;
}

Result<std::vector<uint8_t>> PeerBoxes::Open(const std::string& from_public, const wire::Relay& envelope) {
  const std::string from_id = KeyId(from_public);
  if (envelope.from != from_id || envelope.to != impl_->my_id)
    return PermissionDenied("a relayed frame from " + envelope.from + " to " + envelope.to +
                            " is not from the key the room lists for its sender, or not for this device");
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto seen = impl_->seen.find(from_public);
  const bool first = seen == impl_->seen.end();
  if (!first && envelope.counter <= seen->second.highest) {
    const uint64_t back = seen->second.highest - envelope.counter;
    if (back >= kReplayWindow)
      // The verdict before the figures: a link's close reason keeps only its first 123 bytes.
      return PermissionDenied("a relayed frame from " + Fingerprint(from_public) + " with counter " +
                              std::to_string(envelope.counter) + " is too old to tell from a replay (more than " +
                              std::to_string(kReplayWindow) + " below the highest opened, " +
                              std::to_string(seen->second.highest) + ")");
    if (seen->second.opened.test(back))
      return PermissionDenied("a relayed frame from " + Fingerprint(from_public) + " with counter " +
                              std::to_string(envelope.counter) + ", already opened: a replay");
  }
  if (envelope.box.size() < crypto_box_MACBYTES) return InvalidArgument("a relayed box shorter than its MAC");
  DAISY_ASSIGN_OR_RETURN(const uint8_t* key, impl_->Shared(from_public));
  uint8_t nonce[crypto_box_NONCEBYTES];
  Nonce(envelope.from, envelope.to, envelope.counter, nonce);
  std::vector<uint8_t> frame(envelope.box.size() - crypto_box_MACBYTES);
  if (crypto_box_open_easy_afternm(frame.data(), envelope.box.data(), envelope.box.size(), nonce, key) != 0)
    return PermissionDenied("a relayed frame from " + Fingerprint(from_public) +
                            " does not open: changed on the way, or not sealed by that key for this device");
  Impl::Seen& mark = impl_->seen[from_public];
  if (first || envelope.counter > mark.highest) {
    const uint64_t up = first ? kReplayWindow : envelope.counter - mark.highest;
    mark.opened = up >= kReplayWindow ? std::bitset<kReplayWindow>() : mark.opened << up;
    mark.highest = envelope.counter;
    mark.opened.set(0);
  } else {
    mark.opened.set(mark.highest - envelope.counter);
  }
  return frame;
}

}  // namespace daisy::net

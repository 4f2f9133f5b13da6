// PeerBoxes: the end-to-end box of a frame that crosses serve's relay. The relay ends one
// CurveZMQ link and starts another, so CURVE alone would show it the frame; the box is
// between the two members' long-term keys, which the relay does not hold.
#include "daisy/seal.h"

#include <sodium.h>

#include <chrono>
#include <cstring>
#include <map>

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
  std::map<std::string, uint64_t> last_opened;                                  // by peer key

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
  return impl_->next_counter;
}

Result<wire::Relay> PeerBoxes::Seal(const std::string& to_public, std::span<const uint8_t> frame) {
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
  auto last = impl_->last_opened.find(from_public);
  if (last != impl_->last_opened.end() && envelope.counter <= last->second)
    return PermissionDenied("a relayed frame from " + Fingerprint(from_public) + " with counter " +
                            std::to_string(envelope.counter) + " not above the last opened (" +
                            std::to_string(last->second) + "): a replay or out of order");
  if (envelope.box.size() < crypto_box_MACBYTES) return InvalidArgument("a relayed box shorter than its MAC");
  DAISY_ASSIGN_OR_RETURN(const uint8_t* key, impl_->Shared(from_public));
  uint8_t nonce[crypto_box_NONCEBYTES];
  Nonce(envelope.from, envelope.to, envelope.counter, nonce);
  std::vector<uint8_t> frame(envelope.box.size() - crypto_box_MACBYTES);
  if (crypto_box_open_easy_afternm(frame.data(), envelope.box.data(), envelope.box.size(), nonce, key) != 0)
    return PermissionDenied("a relayed frame from " + Fingerprint(from_public) +
                            " does not open: changed on the way, or not sealed by that key for this device");
  impl_->last_opened[from_public] = envelope.counter;
  return frame;
}

}  // namespace daisy::net

// The client side of DCL1 (docs/WIRE.md, "link"): pure bytes in and out.
#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "daisy/tab.h"

namespace daisy::tab {

namespace {

constexpr size_t kHeader = net::kLinkMagic.size() + 1 + wire::kPublicKeyChars;  // magic | version | key

// The one envelope a link message holds, from `from_id` to `to_id`.
Result<wire::Relay> EnvelopeOf(std::span<const uint8_t> message, const std::string& from_id, const std::string& to_id,
                               const char* what) {
  auto m = wire::Decode(message);
  if (!m.ok()) return InvalidArgument(std::string(what) + " is not an envelope: " + m.status().message());
  auto* env = std::get_if<wire::Relay>(&*m);
  if (env == nullptr) return InvalidArgument(std::string(what) + " is not an envelope");
  if (env->from != from_id || env->to != to_id)
    return PermissionDenied(std::string(what) + " is from " + env->from + " to " + env->to + ", not from serve (" +
                            from_id + ") to this tab (" + to_id + ")");
  return std::move(*env);
}

}  // namespace

LinkClient::LinkClient(net::KeyPair keys, std::string expected_server_key)
    : keys_(std::move(keys)), my_id_(net::KeyId(keys_.public_key)), expected_(std::move(expected_server_key)) {}

LinkClient::~LinkClient() {
  sodium_memzero(challenge_c_.data(), challenge_c_.size());
}

Result<std::vector<uint8_t>> LinkClient::Answer(std::span<const uint8_t> first) {
  if (answered_) return FailedPrecondition("serve's first link message came twice");
  if (first.size() != kHeader + net::kLinkChallengeBytes)
    return InvalidArgument("serve's first link message has " + std::to_string(first.size()) + " bytes, not " +
                           std::to_string(kHeader + net::kLinkChallengeBytes));
  if (std::memcmp(first.data(), net::kLinkMagic.data(), net::kLinkMagic.size()) != 0)
    return InvalidArgument("serve's first link message does not start with " + std::string(net::kLinkMagic));
  if (first[net::kLinkMagic.size()] != net::kLinkVersion)
    return InvalidArgument("serve speaks link version " + std::to_string(first[net::kLinkMagic.size()]) +
                           "; this tab speaks version " + std::to_string(net::kLinkVersion));
  std::string key(reinterpret_cast<const char*>(first.data()) + net::kLinkMagic.size() + 1, wire::kPublicKeyChars);
  if (!net::IsPublicKey(key)) return InvalidArgument("serve's first link message holds no public key");
  if (!expected_.empty() && key != expected_)
    return PermissionDenied("serve's link key " + net::Fingerprint(key) + " is not the key " +
                            net::Fingerprint(expected_) + " shown for this serve");
  // The proof that this tab holds its secret key: both challenges boxed for the rendezvous.
  boxes_ = std::make_unique<net::PeerBoxes>(keys_);
  server_key_ = std::move(key);
  server_id_ = net::KeyId(server_key_);
  randombytes_buf(challenge_c_.data(), challenge_c_.size());
  std::vector<uint8_t> inner(first.end() - net::kLinkChallengeBytes, first.end());
  inner.insert(inner.end(), challenge_c_.begin(), challenge_c_.end());
  DAISY_ASSIGN_OR_RETURN(wire::Relay env, boxes_->Seal(server_key_, inner));
  std::vector<uint8_t> out(net::kLinkMagic.begin(), net::kLinkMagic.end());
  out.push_back(net::kLinkVersion);
  out.insert(out.end(), keys_.public_key.begin(), keys_.public_key.end());
  const std::vector<uint8_t> envelope = wire::Encode(wire::Message(std::move(env)));
  out.insert(out.end(), envelope.begin(), envelope.end());
  answered_ = true;
  return out;
}

Status LinkClient::Confirm(std::span<const uint8_t> proof) {
  if (!answered_ || up_) return FailedPrecondition("serve's link proof came out of turn");
  DAISY_ASSIGN_OR_RETURN(wire::Relay env, EnvelopeOf(proof, server_id_, my_id_, "serve's link proof"));
  auto inner = boxes_->Open(server_key_, env);
  if (!inner.ok()) return PermissionDenied("serve's link proof does not open: " + inner.status().message());
  if (inner->size() != net::kLinkChallengeBytes ||
      sodium_memcmp(inner->data(), challenge_c_.data(), net::kLinkChallengeBytes) != 0)
    return PermissionDenied("serve's link proof holds another challenge than this tab's");
  up_ = true;
  return Status::Ok();
}

Result<std::vector<uint8_t>> LinkClient::Seal(std::span<const uint8_t> inner) {
  if (!up_) return FailedPrecondition("Bug: a frame up a link that is not up");
  DAISY_ASSIGN_OR_RETURN(wire::Relay env, boxes_->Seal(server_key_, inner));
  return wire::Encode(wire::Message(std::move(env)));
}

Result<std::vector<uint8_t>> LinkClient::Open(std::span<const uint8_t> message) {
  if (!up_) return FailedPrecondition("a link message before the link is up");
  if (message.size() > net::kLinkMaxMessage)
    return InvalidArgument("a link message of " + std::to_string(message.size()) + " bytes is over the limit");
  DAISY_ASSIGN_OR_RETURN(wire::Relay env, EnvelopeOf(message, server_id_, my_id_, "a link message"));
  return boxes_->Open(server_key_, env);
}

}  // namespace daisy::tab

// The turn's text for every device of the room, from a thread of its own (text_cast.h).
#include "text_cast.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <utility>

#include "daisy/log.h"

namespace daisy::head {

namespace {
using Clock = std::chrono::steady_clock;
// A member is given this long to take its first message of a stream (a new connection and
// its CURVE handshake), then this long for each of the rest.
constexpr int kFirstContactMs = 3000;
constexpr int kNextMs = 500;
// A stream's messages waiting for the sender at most (about 10 of a slow member's timeouts
// of tokens); beyond it the newest are dropped, never the turn delayed.
constexpr size_t kMaxQueued = 16384;
// On the way out, what is queued gets this long to leave.
constexpr auto kDrain = std::chrono::seconds(3);
}  // namespace

Result<std::unique_ptr<TextCast>> TextCast::Start(const net::KeyPair& keys, std::shared_ptr<net::PeerBoxes> boxes) {
  std::unique_ptr<TextCast> c(new TextCast());
  c->boxes_ = std::move(boxes);
  DAISY_ASSIGN_OR_RETURN(c->out_, net::Endpoint::SendOnly(keys));
  TextCast* raw = c.get();
  c->thread_ = std::thread([raw] { raw->Loop(); });
  return c;
}

TextCast::~TextCast() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TextCast::Begin(std::vector<wire::Peer> members, std::string rendezvous, std::string rendezvous_key) {
  members_ =
      std::make_shared<const Stream>(Stream{std::move(members), std::move(rendezvous), std::move(rendezvous_key)});
  ++stream_;
  tokens_ = 0;
  Queue(wire::Text{stream_, wire::TextKind::kBegin, 0, -1, ""});
}

void TextCast::Piece(int32_t token_id, std::string_view text) {
  // A piece longer than a frame's string goes in several, all under the token's index.
  size_t at = 0;
  do {
    const std::string_view part = text.substr(at, wire::kMaxTextPiece);
    Queue(wire::Text{stream_, wire::TextKind::kPiece, tokens_, at == 0 ? token_id : -1, std::string(part)});
    at += part.size();
  } while (at < text.size());
  ++tokens_;
}

void TextCast::Retract(size_t kept) {
  tokens_ = static_cast<int32_t>(kept);
  Queue(wire::Text{stream_, wire::TextKind::kRetract, tokens_, -1, ""});
}

void TextCast::End(std::string_view tail) {
  size_t at = 0;
  while (tail.size() - at > wire::kMaxTextPiece) {  // all but the last part as pieces of no token
    Queue(wire::Text{stream_, wire::TextKind::kPiece, tokens_, -1, std::string(tail.substr(at, wire::kMaxTextPiece))});
    at += wire::kMaxTextPiece;
  }
  Queue(wire::Text{stream_, wire::TextKind::kEnd, tokens_, -1, std::string(tail.substr(at))});
}

void TextCast::Fail() {
  Queue(wire::Text{stream_, wire::TextKind::kFailed, tokens_, -1, ""});
}

int64_t TextCast::sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}

void TextCast::Queue(wire::Text t) {
  if (!members_ || members_->members.empty()) return;
  Item item{members_, wire::Encode(wire::Message(std::move(t)))};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kMaxQueued) return;
    queue_.push_back(std::move(item));
  }
  cv_.notify_all();
}

void TextCast::Loop() {
  std::shared_ptr<const Stream> current;  // the stream being sent
  std::set<std::string> reached, failed;  // its members, by address
  std::optional<Clock::time_point> drain_until;
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_ && !drain_until) drain_until = Clock::now() + kDrain;
      if (queue_.empty() || (drain_until && Clock::now() > *drain_until)) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (item.to != current) {
      // A new stream: its members' keys, and no links to anyone else.
      current = item.to;
      failed.clear();
      std::vector<std::string> keys;
      std::set<std::string> addresses;
      for (const auto& p : current->members) {
        if (wire::IsRelayAddress(p.address)) continue;
        out_->SetPeerKey(p.address, p.public_key);
        keys.push_back(p.public_key);
        addresses.insert(p.address);
      }
      if (!current->rendezvous_key.empty()) {
        out_->SetPeerKey(current->rendezvous, current->rendezvous_key);
        keys.push_back(current->rendezvous_key);
      }
      out_->KeepOnly(keys);
      std::erase_if(reached, [&](const std::string& a) { return !addresses.count(a); });
    }
    for (const auto& p : current->members) {
      if (failed.count(p.address)) continue;
      const bool known = reached.count(p.address) > 0;
      int timeout = known ? kNextMs : kFirstContactMs;
      if (drain_until) timeout = std::min<int>(timeout, 200);
      Status st = Status::Ok();
      if (!wire::IsRelayAddress(p.address)) {
        st = out_->Send(p.address, item.frame, timeout);
      } else if (!boxes_ || current->rendezvous_key.empty()) {
        st = FailedPrecondition("it accepts no connections and this head has no relay to reach it by");
      } else if (auto env = boxes_->Seal(p.public_key, item.frame); !env.ok()) {
        st = env.status();
      } else {
        // Through serve's relay, which sees only the box (docs/WIRE.md, "relay").
        st = out_->Send(current->rendezvous, wire::Encode(wire::Message(std::move(*env))), timeout);
      }
      if (st.ok()) {
        reached.insert(p.address);
        std::lock_guard<std::mutex> lock(mu_);
        ++sent_;
      } else {
        // It misses the rest of this turn's text; the ring does not wait for it.
        failed.insert(p.address);
        reached.erase(p.address);
        LogInfo("head: " + p.hello.name + " gets no more of this turn's text: " + st.message());
      }
    }
  }
}

}  // namespace daisy::head

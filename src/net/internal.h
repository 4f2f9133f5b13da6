// What the files of net share and nobody else sees: the process's ZeroMQ context (with its
// ZAP handler) and allow-lists for server sockets.
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace daisy::net {

// The process's context; its ZAP handler is bound before any socket can handshake.
zmq::context_t& Context();

// The public keys one server socket admits. Read by the ZAP thread, written by the owner.
struct AllowList {
  mutable std::mutex mu;
  std::set<std::string> keys;  // Z85
  bool Has(const std::string& k) const {
    std::lock_guard<std::mutex> lock(mu);
    return keys.count(k) > 0;
  }
};

// A ZAP domain of its own (a server socket names it in ZMQ_ZAP_DOMAIN) whose handshakes the
// ZAP handler admits only for the keys on its list. Thread-safe.
class ZapDomain {
 public:
  ZapDomain();
  ~ZapDomain();
  ZapDomain(const ZapDomain&) = delete;
  ZapDomain& operator=(const ZapDomain&) = delete;
  const std::string& name() const { return name_; }
  void SetAllowed(const std::vector<std::string>& public_keys);
  bool Has(const std::string& public_key) const { return list_->Has(public_key); }

 private:
  std::string name_;
  std::shared_ptr<AllowList> list_;
};

}  // namespace daisy::net

// Endpoint: a PULL inbox and PUSH outboxes. ZMQ_IMMEDIATE keeps frames from queueing for
// a peer that is not connected, so a send to a dead stage fails instead of waiting forever.
#include <zmq.hpp>

#include <cctype>
#include <chrono>
#include <map>
#include <thread>

#include "daisy/log.h"
#include "daisy/net.h"

namespace daisy::net {

zmq::context_t& Context() {
  static zmq::context_t* ctx = new zmq::context_t(1);  // lives for the process
  return *ctx;
}

Result<std::string> JoinAddress(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size())
    return InvalidArgument("--join wants HOST:PORT, got '" + host_port + "'");
  for (size_t i = 0; i < colon; ++i) {
    const char c = host_port[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'))
      return InvalidArgument("--join host '" + host_port.substr(0, colon) + "' is not a host name or IPv4 address");
  }
  int port = 0;
  for (size_t i = colon + 1; i < host_port.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(host_port[i])) || port > 65535)
      return InvalidArgument("--join port '" + host_port.substr(colon + 1) + "' is not a number");
    port = port * 10 + (host_port[i] - '0');
  }
  if (port < 1 || port > 65535) return InvalidArgument("--join port must be in [1, 65535]");
  return "tcp://" + host_port;
}

struct Endpoint::Impl {
  zmq::socket_t inbox{Context(), zmq::socket_type::pull};
  std::string address;
  std::map<std::string, zmq::socket_t> outboxes;

  zmq::socket_t& Outbox(const std::string& to) {
    auto it = outboxes.find(to);
    if (it != outboxes.end()) return it->second;
    zmq::socket_t s(Context(), zmq::socket_type::push);
    s.set(zmq::sockopt::linger, 200);
    s.set(zmq::sockopt::immediate, 1);
    s.set(zmq::sockopt::sndhwm, 1000);
    s.connect(to);
    return outboxes.emplace(to, std::move(s)).first->second;
  }
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Endpoint::~Endpoint() {
  // The last frames (done, bye) may still sit in ZeroMQ's queues. Closing a socket with a
  // linger lets the I/O thread hand them to the kernel, which delivers them after the
  // process is gone; the short pause gives that thread the moment it needs.
  const bool sent_any = !impl_->outboxes.empty();
  impl_->outboxes.clear();
  if (sent_any) std::this_thread::sleep_for(std::chrono::milliseconds(30));
}

Result<std::unique_ptr<Endpoint>> Endpoint::Bind(const std::string& host, int port) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->inbox.set(zmq::sockopt::linger, 0);
    impl->inbox.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(wire::kMaxFrameBytes));
    impl->inbox.set(zmq::sockopt::rcvhwm, 10000);
    impl->inbox.bind("tcp://" + host + ":" + (port == 0 ? std::string("*") : std::to_string(port)));
    std::string bound = impl->inbox.get(zmq::sockopt::last_endpoint);  // tcp://IP:PORT
    const std::string bound_port = bound.substr(bound.rfind(':') + 1);
    impl->address = "tcp://" + host + ":" + bound_port;
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " + e.what());
  }
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

const std::string& Endpoint::address() const { return impl_->address; }

Status Endpoint::Send(const std::string& address, std::span<const uint8_t> frame, int timeout_ms) {
  try {
    zmq::socket_t& s = impl_->Outbox(address);
    s.set(zmq::sockopt::sndtimeo, timeout_ms);
    auto sent = s.send(zmq::const_buffer(frame.data(), frame.size()), zmq::send_flags::none);
    if (!sent) return Unavailable("could not reach " + address + " within " + std::to_string(timeout_ms) + " ms");
  } catch (const zmq::error_t& e) {
    return Unavailable("sending to " + address + ": " + e.what());
  }
  return Status::Ok();
}

Status Endpoint::Send(const std::string& address, const wire::Message& message, int timeout_ms) {
  const auto bytes = wire::Encode(message);
  return Send(address, bytes, timeout_ms);
}

Result<std::optional<std::vector<uint8_t>>> Endpoint::Receive(int timeout_ms) {
  try {
    zmq::pollitem_t item{impl_->inbox.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms));
    if (!(item.revents & ZMQ_POLLIN)) return std::optional<std::vector<uint8_t>>();
    zmq::message_t msg;
    auto got = impl_->inbox.recv(msg, zmq::recv_flags::dontwait);
    if (!got) return std::optional<std::vector<uint8_t>>();
    const auto* p = static_cast<const uint8_t*>(msg.data());
    return std::optional<std::vector<uint8_t>>(std::vector<uint8_t>(p, p + msg.size()));
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<std::vector<uint8_t>>();
    return Unavailable(std::string("receiving: ") + e.what());
  }
}

void Endpoint::Forget(const std::string& address) { impl_->outboxes.erase(address); }

}  // namespace daisy::net

// The HTTP server of `daisychain serve` (docs/HTTP.md), put together from its parts: the
// front door (access, pages, assets), the UI's API and the host's controls, the
// OpenAI-compatible API, the event hub and the state watcher behind /api/events, and the
// turn runner that queues every request for the ring. JoinServer: the join endpoints alone.
#include "daisy/server.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "access.h"
#include "admin_api.h"
#include "event_hub.h"
#include "front_door.h"
#include "guarded_http.h"
#include "join.h"
#include "model_extras.h"
#include "openai_api.h"
#include "state_watcher.h"
#include "turn_runner.h"
#include "ui_api.h"

namespace daisy {

namespace {

using namespace std::chrono_literals;

// Where tabs fetch their layers (GET /api/key); "" when HF_ENDPOINT is no URL (the head's
// loads say so).
std::string HubEndpointOrNone(const HubOptions& hub) {
  auto e = HubEndpoint(hub);
  return e.ok() ? *e : "";
}

// An up, non-loopback IPv4 address of this machine ("" when none): the one a phone on the
// LAN reaches a serve listening on every address at.
std::string FirstLanAddress() {
  std::string out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN] = {0};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf)) out = buf;
  }
  ::freeifaddrs(list);
  return out;
}

srv::ConnectionLimits LimitsOf(const ServerOptions& o) {
  srv::ConnectionLimits l;
  l.max_threads = static_cast<size_t>(std::max(8, o.threads));
  l.header_timeout_s = o.header_timeout_s > 0 ? o.header_timeout_s : l.header_timeout_s;
  l.body_timeout_s = o.body_timeout_s > 0 ? o.body_timeout_s : l.body_timeout_s;
  return l;
}

ServerOptions WithSecret(ServerOptions o) {
  if (o.admin_secret.empty()) o.admin_secret = srv::NewSecret();
  return o;
}

srv::AccessPolicy PolicyOf(const ServerOptions& o) {
  srv::AccessPolicy p;
  p.admin_secret = o.admin_secret;
  p.api_key = o.api_key;
  p.allowed_hosts = o.allowed_hosts;
  return p;
}

// Binds `http` to the options' address; the port, or an error naming the address.
Result<int> Bind(srv::GuardedHttpServer& http, const std::string& host, int port) {
  const int bound = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return Unavailable("cannot listen for HTTP on " + host + ":" + std::to_string(port));
  http.WidenBacklog();
  return bound;
}

// Serves `http` on a thread of its own; returns once it answers (or after 1 s).
std::thread Listen(srv::GuardedHttpServer& http) {
  std::thread t([&http] { http.listen_after_bind(); });
  for (int i = 0; i < 500 && !http.is_running(); ++i) std::this_thread::sleep_for(2ms);
  return t;
}

}  // namespace

struct Server::Impl {
  explicit Impl(const ServerOptions& o)
      : options(WithSecret(o)),
        http(LimitsOf(o)),
        hub(options.max_event_streams, options.max_event_streams_per_client),
        extras(options.hub),
        runner(*options.session, extras, hub, [this] { state.Poke(); }),
        state(options, runner, extras, hub),
        front(PolicyOf(options), options.source_of),
        ui(hub, state, runner, extras, options.source_of),
        admin(options.rendezvous, *options.session, runner, extras, options.hub.runtime_token,
              [this] { state.Poke(); }),
        openai(*options.session, runner, extras) {}

  const ServerOptions options;
  srv::GuardedHttpServer http;
  srv::EventHub hub;
  srv::ModelExtras extras;
  srv::TurnRunner runner;
  srv::StateWatcher state;
  srv::FrontDoor front;
  srv::UiApi ui;
  srv::AdminApi admin;
  srv::OpenAiApi openai;
  int port = 0;
  std::thread listen_thread;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  impl_->hub.Stop();
  impl_->runner.Stop();
  impl_->http.stop();
  if (impl_->listen_thread.joinable()) impl_->listen_thread.join();
  impl_->state.Stop();
}

int Server::port() const {
  return impl_->port;
}

bool ListensOnLoopbackOnly(const std::string& host) {
  return srv::IsLoopbackListen(host);
}

std::string JoinPageUrl(const std::string& listen_host, int port) {
  if (listen_host.empty() || ListensOnLoopbackOnly(listen_host)) return "";
  std::string host = listen_host;
  if (host == "0.0.0.0" || host == "::" || host == "[::]") host = FirstLanAddress();
  if (host.empty()) return "";
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";  // IPv6 literal
  return "http://" + host + ":" + std::to_string(port) + "/join";
}

const std::string& Server::admin_secret() const {
  return impl_->options.admin_secret;
}

Status Server::Load(const std::string& source, int ctx) {
  auto m = impl_->runner.Load(source, ctx);
  impl_->state.Poke();
  return m.ok() ? Status() : m.status();
}

void Server::ShowRoomText(const RoomText& t) {
  impl_->hub.Broadcast(srv::SseEvent("room_text", srv::Json{{"head_id", t.head_id},
                                                            {"head", t.head_name},
                                                            {"stream", t.stream},
                                                            {"kind", t.kind},
                                                            {"index", t.index},
                                                            {"text", t.text}}));
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (!options.session) return InvalidArgument("Bug: Server needs a HeadSession");
  // A client that hangs up must not kill the process with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>(options);
  impl->runner.set_default_stages(options.default_stages);
  srv::GuardedHttpServer& http = impl->http;
  http.set_keep_alive_timeout(5);
  http.set_read_timeout(30);
  http.set_write_timeout(30);
  http.set_payload_max_length(size_t{16} << 20);
  impl->front.AddRoutes(http);
  impl->ui.AddRoutes(http);
  impl->admin.AddRoutes(http);
  // An HF_ENDPOINT that is no URL: the head's loads say so; tabs are told no endpoint.
  srv::AddJoinRoutes(http, options.rendezvous, options.room, options.source_of, HubEndpointOrNone(options.hub));
  impl->openai.AddRoutes(http);
  DAISY_ASSIGN_OR_RETURN(impl->port, Bind(http, options.host, options.port));
  impl->listen_thread = Listen(http);
  impl->state.Refresh();
  impl->state.Start();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

struct JoinServer::Impl {
  srv::GuardedHttpServer http{srv::ConnectionLimits{}};
  int port = 0;
  std::thread listen_thread;
};

JoinServer::JoinServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

JoinServer::~JoinServer() {
  impl_->http.stop();
  if (impl_->listen_thread.joinable()) impl_->listen_thread.join();
}

int JoinServer::port() const {
  return impl_->port;
}

Result<std::unique_ptr<JoinServer>> JoinServer::Start(const JoinServerOptions& options) {
  if (!options.rendezvous) return InvalidArgument("Bug: JoinServer needs a rendezvous");
  ::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>();
  impl->http.set_read_timeout(10);
  impl->http.set_payload_max_length(size_t{64} << 10);
  srv::AddJoinRoutes(impl->http, options.rendezvous, options.room, options.source_of, HubEndpointOrNone(HubOptions{}));
  DAISY_ASSIGN_OR_RETURN(impl->port, Bind(impl->http, options.host, options.port));
  impl->listen_thread = Listen(impl->http);
  return std::unique_ptr<JoinServer>(new JoinServer(std::move(impl)));
}

}  // namespace daisy

// Internal: the join endpoints of a rendezvous over HTTP (GET /api/key, POST /api/join),
// shared by the full server of `serve` and the join-only server of `demo`.
#pragma once

#include <httplib.h>

#include <functional>
#include <string>

namespace daisy {
namespace net {
class Rendezvous;
}
namespace srv {

// Where a request really came from: the port mux's client for a relayed connection,
// otherwise the peer address httplib saw.
using SourceOf = std::function<std::string(int remote_port)>;

// `hub_endpoint`: where devices fetch their layers from (serve's HF_ENDPOINT setting; a
// browser tab reads it from GET /api/key, as it never fetches through serve); "": unknown.
void AddJoinRoutes(httplib::Server& http, net::Rendezvous* rendezvous, std::string room_hint, const SourceOf& source_of,
                   std::string hub_endpoint);

}  // namespace srv
}  // namespace daisy

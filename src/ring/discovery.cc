// Finding a room on the LAN: serve's multicast announcement, its parser, and the listener a
// node without --join uses. The announcement only says where to knock and which server key
// to expect; admission by the host is unchanged.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "daisy/log.h"
#include "daisy/ring.h"

namespace daisy {
namespace {

constexpr char kMagic[4] = {'D', 'C', 'R', 'M'};
constexpr size_t kMaxRoom = 64;

Status CheckRoom(std::string_view room) {
  if (room.empty() || room.size() > kMaxRoom) return InvalidArgument("room name must be 1 to 64 bytes");
  for (char c : room)
    if (c < 0x21 || c > 0x7e) return InvalidArgument("room name must be printable ASCII without spaces");
  return Status();
}

// Exactly what net::Fingerprint writes: four groups of four lower-case hex digits.
bool IsFingerprint(std::string_view f) {
  if (f.size() != 19) return false;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (i % 5 == 4) {
      if (c != '-') return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

// Up, multicast-capable, non-loopback IPv4 interfaces (network order): where a room can be.
std::vector<uint32_t> MulticastInterfaces() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_MULTICAST) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    out.push_back(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
  }
  ::freeifaddrs(list);
  return out;
}

std::string Ipv4Text(uint32_t net_order) {
  char buf[INET_ADDRSTRLEN] = {0};
  in_addr a{};
  a.s_addr = net_order;
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

}  // namespace

Result<std::string> EncodeAnnouncement(const Announcement& a) {
  Status st = CheckRoom(a.room);
  if (!st.ok()) return InvalidArgument("cannot announce room '" + a.room + "': " + st.message());
  if (a.port < 1 || a.port > 65535) return InvalidArgument("cannot announce port " + std::to_string(a.port));
  if (!IsFingerprint(a.fingerprint)) return InvalidArgument("cannot announce fingerprint '" + a.fingerprint + "'");
  std::string d(kMagic, sizeof kMagic);
  d += static_cast<char>(kAnnounceVersion);
  d += static_cast<char>((a.port >> 8) & 0xff);
  d += static_cast<char>(a.port & 0xff);
  d += static_cast<char>(a.room.size());
  d += a.room;
  d += static_cast<char>(a.fingerprint.size());
  d += a.fingerprint;
  return d;
}

Result<Announcement> ParseAnnouncement(std::string_view d) {
  auto u8 = [&](size_t at) { return static_cast<uint8_t>(d[at]); };
  if (d.size() < 8 || std::memcmp(d.data(), kMagic, sizeof kMagic) != 0)
    return InvalidArgument("not a daisychain room announcement");
  if (u8(4) != kAnnounceVersion)
    return InvalidArgument("room announcement version " + std::to_string(u8(4)) + " (this build reads " +
                           std::to_string(kAnnounceVersion) + ")");
  Announcement a;
  a.port = (u8(5) << 8) | u8(6);
  if (a.port == 0) return InvalidArgument("room announcement with port 0");
  const size_t room_len = u8(7);
  size_t at = 8;
  if (d.size() < at + room_len + 1) return InvalidArgument("truncated room announcement (room)");
  a.room = std::string(d.substr(at, room_len));
  Status st = CheckRoom(a.room);
  if (!st.ok()) return InvalidArgument("room announcement: " + st.message());
  at += room_len;
  const size_t fpr_len = u8(at++);
  if (d.size() < at + fpr_len) return InvalidArgument("truncated room announcement (fingerprint)");
  if (d.size() > at + fpr_len) return InvalidArgument("room announcement with trailing bytes");
  a.fingerprint = std::string(d.substr(at, fpr_len));
  if (!IsFingerprint(a.fingerprint)) return InvalidArgument("room announcement with a malformed key fingerprint");
  return a;
}

Result<std::unique_ptr<Announcer>> Announcer::Start(const Announcement& a, const std::string& interface_address,
                                                    int port) {
  auto d = EncodeAnnouncement(a);
  if (!d.ok()) return d.status();
  std::unique_ptr<Announcer> an(new Announcer());
  an->datagram_ = *d;
  an->port_ = port;
  if (interface_address.empty() || interface_address == "0.0.0.0") {
    an->interfaces_ = MulticastInterfaces();
    if (an->interfaces_.empty()) return Unavailable("no multicast-capable network interface to announce the room on");
  } else {
    in_addr ia{};
    if (::inet_pton(AF_INET, interface_address.c_str(), &ia) != 1)
      return InvalidArgument("cannot announce on '" + interface_address + "': not an IPv4 address");
    an->interfaces_.push_back(ia.s_addr);
  }
  an->fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (an->fd_ < 0) return Unavailable(std::string("cannot open the announcement socket: ") + std::strerror(errno));
  // TTL 1: the datagram never crosses a router. Loop: a node on this machine hears it too.
  const unsigned char ttl = 1, loop = 1;
  ::setsockopt(an->fd_, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl);
  ::setsockopt(an->fd_, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop);
  Announcer* raw = an.get();
  an->thread_ = std::thread([raw] { raw->Loop(); });
  return an;
}

Announcer::~Announcer() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

void Announcer::Loop() {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port_));
  ::inet_pton(AF_INET, kDiscoveryGroup, &to.sin_addr);
  bool warned = false;
  while (!stop_.load()) {
    for (uint32_t ifa : interfaces_) {
      in_addr ia{};
      ia.s_addr = ifa;
      ::setsockopt(fd_, IPPROTO_IP, IP_MULTICAST_IF, &ia, sizeof ia);
      if (::sendto(fd_, datagram_.data(), datagram_.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to) ==
          static_cast<ssize_t>(datagram_.size())) {
        sent_.fetch_add(1);
      } else if (!warned) {
        // Once: a machine without a multicast route keeps serving; devices can still --join.
        LogWarning("serve: cannot announce the room on " + Ipv4Text(ifa) + ": " + std::strerror(errno));
        warned = true;
      }
    }
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::milliseconds(kAnnounceIntervalMs), [this] { return stop_.load(); });
  }
}

Result<std::vector<Announcement>> ListenForRooms(double seconds, const std::atomic<bool>* stop, int port) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("cannot open a socket to listen for rooms: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const int one = 1;
  // Several listeners on one machine (nodes starting together) share the port.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(static_cast<uint16_t>(port));
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0)
    return Unavailable("cannot listen for rooms on UDP port " + std::to_string(port) + ": " + std::strerror(errno));
  ip_mreq mreq{};
  ::inet_pton(AF_INET, kDiscoveryGroup, &mreq.imr_multiaddr);
  int joined = 0;
  for (uint32_t ifa : MulticastInterfaces()) {
    mreq.imr_interface.s_addr = ifa;
    if (::setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mreq, sizeof mreq) == 0) ++joined;
  }
  if (joined == 0)
    return Unavailable(std::string("cannot listen for rooms: no multicast-capable network interface joined ") +
                       kDiscoveryGroup);
  std::vector<Announcement> found;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!(stop && stop->load())) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
    if (r <= 0) continue;
    char buf[512];
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const ssize_t n = ::recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
    if (n <= 0) continue;
    auto a = ParseAnnouncement(std::string_view(buf, static_cast<size_t>(n)));
    if (!a.ok()) continue;  // someone else's datagram on this group: not ours to judge
    a->address = Ipv4Text(from.sin_addr.s_addr);
    bool seen = false;
    for (const auto& f : found) seen = seen || f == *a;
    if (!seen) found.push_back(*a);
  }
  return found;
}

Result<Announcement> ChooseRoom(const std::vector<Announcement>& found, const std::string& room) {
  auto list = [](const std::vector<Announcement>& v) {
    std::string s;
    for (const auto& a : v)
      s += "\n  room '" + a.room + "' at " + a.address + ":" + std::to_string(a.port) + "  server key " + a.fingerprint;
    return s;
  };
  if (found.empty())
    return InvalidArgument(
        "no room announced on this network (serve announces on UDP " + std::string(kDiscoveryGroup) + ":" +
        std::to_string(kDiscoveryPort) +
        " when it listens on a network address and was not given --no-announce); pass --join HOST:PORT as "
        "`daisychain serve` prints it");
  std::vector<Announcement> match;
  for (const auto& a : found)
    if (room.empty() || a.room == room) match.push_back(a);
  if (match.size() == 1) return match[0];
  if (match.empty()) return InvalidArgument("no room '" + room + "' on this network; found:" + list(found));
  return InvalidArgument(std::string(room.empty() ? "several rooms on this network: pass --room NAME (or --join)"
                                                  : "several servers announce room '" + room + "': pass --join") +
                         list(match));
}

std::string LocalAddressTowards(const std::string& address) {
  in_addr ia{};
  if (::inet_pton(AF_INET, address.c_str(), &ia) != 1) return "";
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  // A UDP connect sends nothing: it only asks the routing table which source it would use.
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);
  to.sin_addr = ia;
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) out = Ipv4Text(me.sin_addr.s_addr);
  }
  ::close(fd);
  return out;
}

}  // namespace daisy

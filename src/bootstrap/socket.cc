#include "bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

namespace chorus {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// The descriptors that Sockets own. In a child forked without exec each is replaced by /dev/null: the child cannot
// use its parent's communicators (their threads did not survive the fork), and a connection it kept open would hide
// its parent's death from every peer for as long as the child lives (a data-loader worker, say). Replacing rather
// than closing keeps the numbers taken, so a Socket the child destroys later closes its own /dev/null, not a
// descriptor the child has opened since.
class OwnedDescriptors {
 public:
  static OwnedDescriptors& get() {
    static OwnedDescriptors* d = [] {
      auto* o = new OwnedDescriptors;  // never destroyed: a fork may come during static destruction
      pthread_atfork([] { get().mu_.lock(); }, [] { get().mu_.unlock(); }, [] { get().release_in_child(); });
      return o;
    }();
    return *d;
  }
  // socket(2), accept4(2) and close(2) of an owned descriptor, each with its registration under the lock that a
  // fork's prepare handler takes: a fork never falls between making a descriptor and registering it (the child
  // would keep an unregistered connection), nor between forgetting one and closing it. Results and errno as the
  // system calls'.
  int socket(int domain, int type) {
    std::lock_guard<std::mutex> lock(mu_);
    const int fd = ::socket(domain, type, 0);
    return registered(fd);
  }
  int accept4(int listener, sockaddr* addr, socklen_t* len, int flags) {
    std::lock_guard<std::mutex> lock(mu_);
    const int fd = ::accept4(listener, addr, len, flags);
    return registered(fd);
  }
  void close(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    fds_.erase(fd);
    ::close(fd);  // never retried on EINTR: on Linux the descriptor is released either way
  }

 private:
  // Runs in the child, on the thread that forked, with mu_ held since the prepare handler; only async-signal-safe
  // calls (open, dup3, close, socket).
  void release_in_child() {
    int placeholder = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (placeholder < 0) placeholder = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    for (int fd : fds_)
      if (placeholder < 0 || ::dup3(placeholder, fd, O_CLOEXEC) < 0) ::close(fd);
    if (placeholder >= 0) ::close(placeholder);
    mu_.unlock();
  }

  int registered(int fd) {
    if (fd < 0) return fd;
    const int saved = errno;
    try {
      fds_.insert(fd);
    } catch (...) {
      ::close(fd);
      errno = ENOMEM;
      return -1;
    }
    errno = saved;
    return fd;
  }

  std::mutex mu_;
  std::unordered_set<int> fds_;
};

[[noreturn]] void throw_sys(const std::string& what, int err) {
  throw Error(chorusSystemError, Subsys::Bootstrap, cat(what, ": ", errno_text(err)));
}

std::string peer_text(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "the peer";  // already disconnected
  return sockaddr_to_string(ss);
}

// Waits until `fd` has one of `events`; returns the revents, or 0 once `deadline` has passed. poll() sees
// POLLHUP/POLLERR too, which the caller's next send/recv turns into a precise error.
short wait_fd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.remaining_ms());
    if (rc > 0) return p.revents;
    if (rc == 0) {
      if (deadline.passed()) return 0;
      continue;  // remaining_ms() rounds down: less than a millisecond is left
    }
    if (errno != EINTR) throw_sys("poll on a socket failed", errno);
  }
}

// Refused, timed out or reset: the peer may not listen yet. Out of ephemeral ports or buffers: transient. Anything
// else (network or host unreachable: no route, or no answer to ARP) retrying does not fix.
bool retryable_connect_error(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNRESET || err == EADDRNOTAVAIL || err == EAGAIN ||
         err == ENOBUFS;
}

struct IfaddrsDeleter {
  void operator()(ifaddrs* p) const { freeifaddrs(p); }
};
using IfaddrsPtr = std::unique_ptr<ifaddrs, IfaddrsDeleter>;

IfaddrsPtr get_ifaddrs() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw_sys("getifaddrs failed", errno);
  return IfaddrsPtr(list);
}

bool is_inet(const ifaddrs* ifa) {
  return ifa->ifa_addr != nullptr && (ifa->ifa_addr->sa_family == AF_INET || ifa->ifa_addr->sa_family == AF_INET6);
}

sockaddr_storage copy_addr(const sockaddr* sa) {
  sockaddr_storage ss{};
  std::memcpy(&ss, sa, sa->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  set_sockaddr_port(ss, 0);
  return ss;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) {
    OwnedDescriptors::get().close(fd_);
    fd_ = -1;
  }
}

void Socket::shutdown(bool write_only) const {
  if (fd_ >= 0) ::shutdown(fd_, write_only ? SHUT_WR : SHUT_RDWR);
}

Socket Socket::listen(const sockaddr_storage& addr, int backlog) {
  int fd = OwnedDescriptors::get().socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) throw_sys(cat("cannot create a socket to listen on ", sockaddr_to_string(addr)), errno);
  Socket s(fd);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr.ss_family == AF_INET6) {
    // The IPv6 wildcard takes IPv4 peers too, whatever net.ipv6.bindv6only says: ranks that resolve the root's
    // name to an IPv4 address still reach it.
    int zero = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sockaddr_len(addr)) != 0)
    throw_sys(cat("cannot bind ", sockaddr_to_string(addr)), errno);
  if (::listen(fd, backlog) != 0) throw_sys(cat("cannot listen on ", sockaddr_to_string(addr)), errno);
  return s;
}

Socket Socket::connect(const sockaddr_storage& addr, Deadline deadline) {
  int backoff_ms = 5;
  for (;;) {
    int fd = OwnedDescriptors::get().socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) throw_sys(cat("cannot create a socket to connect to ", sockaddr_to_string(addr)), errno);
    Socket s(fd);
    int err = 0;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sockaddr_len(addr)) != 0) err = errno;
    if (err == EINPROGRESS || err == EINTR) {
      if (wait_fd(fd, POLLOUT, deadline) == 0) {
        err = ETIMEDOUT;
      } else {
        socklen_t len = sizeof(err);
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      }
    }
    if (err == 0) {
      s.set_nodelay();
      return s;
    }
    if (!retryable_connect_error(err) || deadline.passed())
      throw_sys(cat("cannot connect to ", sockaddr_to_string(addr)), err);
    CHORUS_TRACE(Bootstrap, "connect to %s: %s; retrying in %d ms", sockaddr_to_string(addr).c_str(),
                 errno_text(err).c_str(), backoff_ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff_ms, deadline.remaining_ms())));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
}

ConnectRetries::ConnectRetries(std::string whom, int warn_after_ms)
    : whom_(std::move(whom)), warn_after_ms_(warn_after_ms), start_(std::chrono::steady_clock::now()) {}

bool ConnectRetries::retry(const std::exception& error, const Deadline& slice, const Deadline& deadline) {
  if (deadline.passed() || !slice.passed()) return false;
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_).count();
  if (!warned_ && waited >= warn_after_ms_) {
    warned_ = true;
    CHORUS_WARN(Bootstrap, "%s: not reached after %lld s (%s); still trying, for %d s more (CHORUS_TIMEOUT_MS)",
                whom_.c_str(), static_cast<long long>(waited / 1000), error.what(), deadline.remaining_ms() / 1000);
  }
  return true;
}

std::string ConnectRetries::why(const std::exception& error) const {
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_).count();
  return cat(error.what(), " (tried for ", waited, " ms)");
}

Socket Socket::accept(Deadline deadline) const {
  for (;;) {
    Socket s = try_accept();
    if (s.valid()) return s;
    if (wait_fd(fd_, POLLIN, deadline) == 0)
      throw Error(chorusTimeout, Subsys::Bootstrap,
                  cat("timed out waiting for a connection on ", sockaddr_to_string(local_addr())));
  }
}

Socket Socket::try_accept(sockaddr_storage* peer) const {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = OwnedDescriptors::get().accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (peer != nullptr) *peer = ss;
      Socket s(fd);
      s.set_nodelay();
      return s;
    }
    // A connection that was reset while queued is the peer's problem, not the listener's: try the next one.
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Socket();
    throw_sys(cat("accept on ", sockaddr_to_string(local_addr()), " failed"), errno);
  }
}

sockaddr_storage Socket::local_addr() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) throw_sys("getsockname failed", errno);
  return ss;
}

sockaddr_storage Socket::peer_addr() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) throw_sys("getpeername failed", errno);
  return ss;
}

void Socket::send_all(const void* data, size_t bytes, Deadline deadline) const {
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    ssize_t n = ::send(fd_, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      left -= static_cast<size_t>(n);
      continue;
    }
    int err = n < 0 ? errno : EPIPE;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (wait_fd(fd_, POLLOUT, deadline) == 0)
        throw Error(chorusTimeout, Subsys::Bootstrap,
                    cat("timed out sending to ", peer_text(fd_), " (", bytes - left, " of ", bytes, " bytes sent)"));
      continue;
    }
    if (err == EPIPE || err == ECONNRESET)
      throw Error(chorusSystemError, Subsys::Bootstrap,
                  cat("sending to ", peer_text(fd_), ": connection closed by peer (", errno_text(err), ")"));
    throw_sys(cat("sending to ", peer_text(fd_), " failed"), err);
  }
}

bool Socket::wait_readable(Deadline deadline) const { return wait_fd(fd_, POLLIN, deadline) != 0; }

void Socket::recv_all(void* data, size_t bytes, Deadline deadline) const {
  char* p = static_cast<char*>(data);
  size_t left = bytes;
  while (left > 0) {
    ssize_t n = ::recv(fd_, p, left, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      left -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      throw Error(chorusSystemError, Subsys::Bootstrap,
                  cat("receiving from ", peer_text(fd_), ": connection closed by peer (", bytes - left, " of ", bytes,
                      " bytes received)"));
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (wait_fd(fd_, POLLIN, deadline) == 0)
        throw Error(
            chorusTimeout, Subsys::Bootstrap,
            cat("timed out receiving from ", peer_text(fd_), " (", bytes - left, " of ", bytes, " bytes received)"));
      continue;
    }
    if (err == ECONNRESET)
      throw Error(chorusSystemError, Subsys::Bootstrap,
                  cat("receiving from ", peer_text(fd_), ": connection closed by peer (reset)"));
    throw_sys(cat("receiving from ", peer_text(fd_), " failed"), err);
  }
}

void Socket::set_nonblocking(bool on) const {
  int flags = ::fcntl(fd_, F_GETFL, 0);
  if (flags < 0) throw_sys("fcntl(F_GETFL) failed", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd_, F_SETFL, flags) != 0) throw_sys("fcntl(F_SETFL) failed", errno);
}

void Socket::set_nodelay() const {
  int one = 1;
  // Bootstrap messages are small request/response frames: Nagle would add tens of milliseconds to each.
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::vector<std::string> interface_names() {
  std::vector<std::string> names;
  IfaddrsPtr list = get_ifaddrs();
  for (const ifaddrs* ifa = list.get(); ifa != nullptr; ifa = ifa->ifa_next) {
    if (!is_inet(ifa)) continue;
    if (std::find(names.begin(), names.end(), ifa->ifa_name) == names.end()) names.emplace_back(ifa->ifa_name);
  }
  return names;
}

sockaddr_storage interface_address(const std::string& ifname) {
  IfaddrsPtr list = get_ifaddrs();
  const ifaddrs* v4 = nullptr;
  const ifaddrs* v6_global = nullptr;
  const ifaddrs* v6_any = nullptr;
  for (const ifaddrs* ifa = list.get(); ifa != nullptr; ifa = ifa->ifa_next) {
    if (!is_inet(ifa) || ifname != ifa->ifa_name) continue;
    if (ifa->ifa_addr->sa_family == AF_INET) {
      if (v4 == nullptr) v4 = ifa;
    } else {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
      if (v6_any == nullptr) v6_any = ifa;
      // Link-local addresses need a scope id on every peer; a global one does not.
      if (v6_global == nullptr && !IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) v6_global = ifa;
    }
  }
  const ifaddrs* pick = v4 != nullptr ? v4 : (v6_global != nullptr ? v6_global : v6_any);
  if (pick != nullptr) return copy_addr(pick->ifa_addr);
  std::string names;
  for (const std::string& n : interface_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error(chorusInvalidArgument, Subsys::Bootstrap,
              cat("CHORUS_SOCKET_IFNAME=", ifname,
                  ": no such interface; interfaces with an address: ", names.empty() ? "(none)" : names));
}

sockaddr_storage default_address() {
  if (param_is_set(Param::SocketIfname)) return interface_address(param_str(Param::SocketIfname));
  IfaddrsPtr list = get_ifaddrs();
  // Container and VM bridges (docker0, virbr0) carry the same address on every host (172.17.0.1, 192.168.122.1),
  // which other hosts cannot reach: taken only when nothing else is up, as NCCL leaves docker* out by default.
  auto host_local_bridge = [](const char* name) {
    return std::strncmp(name, "docker", 6) == 0 || std::strncmp(name, "virbr", 5) == 0;
  };
  for (bool bridges : {false, true}) {
    for (const ifaddrs* ifa = list.get(); ifa != nullptr; ifa = ifa->ifa_next) {
      if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
      if ((ifa->ifa_flags & IFF_UP) == 0 || (ifa->ifa_flags & IFF_LOOPBACK) != 0) continue;
      if (host_local_bridge(ifa->ifa_name) != bridges) continue;
      return copy_addr(ifa->ifa_addr);
    }
  }
  sockaddr_storage ss{};
  auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ss;
}

sockaddr_storage resolve(const std::string& host_in, int port) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (port < 0 || port > 65535)
    throw Error(chorusInvalidArgument, Subsys::Bootstrap, cat("port ", port, " for host '", host, "' is out of range"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    chorusResult_t code = (rc == EAI_NONAME || rc == EAI_FAIL) ? chorusInvalidArgument : chorusSystemError;
    std::string why = rc == EAI_SYSTEM ? errno_text(errno) : std::string(gai_strerror(rc));
    throw Error(code, Subsys::Bootstrap, cat("cannot resolve host '", host, "': ", why));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, &freeaddrinfo);
  const addrinfo* pick = nullptr;
  for (const addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      pick = ai;
      break;
    }
    if (ai->ai_family == AF_INET6 && pick == nullptr) pick = ai;
  }
  if (pick == nullptr)
    throw Error(chorusInvalidArgument, Subsys::Bootstrap, cat("host '", host, "' has no IPv4 or IPv6 address"));
  sockaddr_storage ss{};
  std::memcpy(&ss, pick->ai_addr, pick->ai_addrlen);
  return ss;
}

std::string sockaddr_to_string(const sockaddr_storage& addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    return cat(buf, ":", ntohs(sin->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof(buf));
    std::string scope;
    if (sin6->sin6_scope_id != 0) {
      char name[IF_NAMESIZE] = {};
      scope = ::if_indextoname(sin6->sin6_scope_id, name) != nullptr ? cat("%", name) : cat("%", sin6->sin6_scope_id);
    }
    return cat("[", buf, scope, "]:", ntohs(sin6->sin6_port));
  }
  return cat("(address family ", addr.ss_family, ")");
}

int sockaddr_port(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

void set_sockaddr_port(sockaddr_storage& addr, int port) {
  if (addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
  if (addr.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
}

socklen_t sockaddr_len(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

bool sockaddr_is_loopback(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr.s_addr) >> 24) == 127;
  if (addr.ss_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr);
  return false;
}

}  // namespace chorus

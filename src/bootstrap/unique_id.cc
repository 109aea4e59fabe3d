#include "bootstrap/unique_id.h"

#include <sys/random.h>

#include <cerrno>

#include <cstring>

#include "bootstrap/root.h"
#include "bootstrap/socket.h"
#include "core/error.h"
#include "core/log.h"

namespace chorus {

namespace {

// Layout of the 128 bytes (all integers big-endian; the rest is zero):
//   [0, 4)   magic "CHid"          [4]  version          [5] family: 4 or 6      [6, 8) port
//   [8, 24)  address (4 or 16 bytes, zero padded)        [24, 28) IPv6 scope id
//   [28, 44) secret
constexpr char kMagic[4] = {'C', 'H', 'i', 'd'};
constexpr uint8_t kVersion = 1;
constexpr size_t kPortOff = 6, kAddrOff = 8, kScopeOff = 24, kSecretOff = 28;
static_assert(kSecretOff + sizeof(Secret) <= CHORUS_UNIQUE_ID_BYTES);

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

chorusUniqueId encode_unique_id(const UniqueIdData& data) {
  chorusUniqueId id{};
  auto* b = reinterpret_cast<uint8_t*>(id.internal);
  std::memcpy(b, kMagic, 4);
  b[4] = kVersion;
  int port = sockaddr_port(data.root);
  b[kPortOff] = static_cast<uint8_t>(port >> 8);
  b[kPortOff + 1] = static_cast<uint8_t>(port);
  if (data.root.ss_family == AF_INET) {
    b[5] = 4;
    std::memcpy(b + kAddrOff, &reinterpret_cast<const sockaddr_in*>(&data.root)->sin_addr, 4);
  } else if (data.root.ss_family == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&data.root);
    b[5] = 6;
    std::memcpy(b + kAddrOff, &sin6->sin6_addr, 16);
    uint32_t scope = sin6->sin6_scope_id;
    for (int i = 0; i < 4; ++i) b[kScopeOff + i] = static_cast<uint8_t>(scope >> (24 - 8 * i));
  } else {
    throw Error(chorusInvalidArgument, Subsys::Bootstrap,
                cat("cannot encode a unique id for address family ", data.root.ss_family));
  }
  std::memcpy(b + kSecretOff, data.secret.data(), data.secret.size());
  return id;
}

UniqueIdData decode_unique_id(const chorusUniqueId& id) {
  const auto* b = reinterpret_cast<const uint8_t*>(id.internal);
  if (std::memcmp(b, kMagic, 4) != 0 || (b[5] != 4 && b[5] != 6))
    throw Error(chorusInvalidArgument, Subsys::Bootstrap, "commId is not a Chorus unique id");
  if (b[4] != kVersion)
    throw Error(chorusInvalidArgument, Subsys::Bootstrap,
                cat("commId is a Chorus unique id of version ", int{b[4]}, "; this build reads version ", int{kVersion},
                    " (mixed Chorus versions in one job?)"));
  UniqueIdData data;
  int port = (int{b[kPortOff]} << 8) | b[kPortOff + 1];
  if (b[5] == 4) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&data.root);
    sin->sin_family = AF_INET;
    std::memcpy(&sin->sin_addr, b + kAddrOff, 4);
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&data.root);
    sin6->sin6_family = AF_INET6;
    std::memcpy(&sin6->sin6_addr, b + kAddrOff, 16);
    uint32_t scope = 0;
    for (int i = 0; i < 4; ++i) scope = (scope << 8) | b[kScopeOff + i];
    sin6->sin6_scope_id = scope;
  }
  set_sockaddr_port(data.root, port);
  std::memcpy(data.secret.data(), b + kSecretOff, data.secret.size());
  return data;
}

void os_random_bytes(uint8_t* out, size_t n, const char* what) {
  for (size_t got = 0; got < n;) {
    const ssize_t r = getrandom(out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw Error(chorusSystemError, Subsys::Bootstrap,
                  cat("getrandom failed to produce ", what, ": ", std::strerror(r < 0 ? errno : EIO)));
    got += static_cast<size_t>(r);
  }
}

Secret random_secret() {
  Secret s{};
  os_random_bytes(s.data(), s.size(), "a secret");
  return s;
}

Secret parse_secret(const std::string& hex, const char* what) {
  Secret s{};
  if (hex.size() != 2 * s.size())
    throw Error(chorusInvalidArgument, Subsys::Bootstrap,
                cat(what, " must be ", 2 * s.size(), " hex digits (e.g. from `openssl rand -hex 16`); it has ",
                    hex.size(), " characters"));
  for (size_t i = 0; i < s.size(); ++i) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      throw Error(chorusInvalidArgument, Subsys::Bootstrap,
                  cat(what, " must be ", 2 * s.size(), " hex digits; character ", (hi < 0 ? 2 * i : 2 * i + 1) + 1,
                      " is not one"));
    s[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return s;
}

std::string secret_to_hex(const Secret& s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * s.size());
  for (uint8_t v : s) {
    out += kDigits[v >> 4];
    out += kDigits[v & 15];
  }
  return out;
}

UniqueIdData create_unique_id() {
  UniqueIdData data;
  data.secret = random_secret();
  sockaddr_storage bind_addr = default_address();
  set_sockaddr_port(bind_addr, 0);
  RootOptions options;
  options.one_rendezvous = true;  // a fresh random secret: this id's rendezvous is the only one with it
  data.root = start_root(bind_addr, data.secret, options);
  CHORUS_INFO(Bootstrap, "created a unique id; its root service listens on %s", sockaddr_to_string(data.root).c_str());
  return data;
}

void start_root_service(const sockaddr_storage& bind_addr, const Secret& secret) { start_root(bind_addr, secret); }

}  // namespace chorus

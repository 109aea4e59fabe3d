// The unique id (chorusUniqueId, 128 bytes): a magic, the root's socket address and a 128-bit random secret.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <string>

#include <chorus/chorus.h>

namespace chorus {

using Secret = std::array<uint8_t, 16>;

struct UniqueIdData {
  sockaddr_storage root{};  // IPv4 or IPv6 address and port of the root service
  Secret secret{};
};

// Serialise into / parse from the opaque 128-byte id. parse throws chorusInvalidArgument ("commId is not a Chorus
// unique id") on a bad magic or address family.
chorusUniqueId encode_unique_id(const UniqueIdData& data);
UniqueIdData decode_unique_id(const chorusUniqueId& id);

// Fills `out` with `n` bytes from the kernel's CSPRNG (getrandom(2): no per-thread state to leak, unlike OpenSSL's
// per-thread generators in the detached root-service thread). Throws chorusSystemError naming `what`.
void os_random_bytes(uint8_t* out, size_t n, const char* what);
// Random secret from the kernel's CSPRNG.
Secret random_secret();
// Parses 32 hex digits; throws chorusInvalidArgument naming `what` otherwise.
Secret parse_secret(const std::string& hex, const char* what);
std::string secret_to_hex(const Secret& s);

// Creates a unique id: picks the interface (CHORUS_SOCKET_IFNAME, else the first non-loopback interface that is
// up, else loopback), starts a root service for `nranks`-agnostic rendezvous on an ephemeral port there, and
// returns its address with a fresh secret. The service lives in this process until every rank that joined has
// said goodbye (or died).
UniqueIdData create_unique_id();

// Starts a root service listening on `bind_addr` (port given) with `secret`; used by rank 0 for launcher-
// environment init. Throws chorusSystemError if the port cannot be bound.
void start_root_service(const sockaddr_storage& bind_addr, const Secret& secret);

std::string sockaddr_to_string(const sockaddr_storage& addr);

}  // namespace chorus

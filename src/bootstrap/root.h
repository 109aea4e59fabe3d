// The bootstrap root service and the framed protocol its ranks speak to it.
//
// Service: one detached thread per unique id, running a poll() loop over the listening socket and every
// connection. It never blocks on one peer: reads are non-blocking, and every connection has its own output queue
// flushed when the socket is writable. A new connection must authenticate (auth.h) and then send JOIN within
// RootOptions::auth_timeout_ms, else it is closed and logged; whatever a stranger does, the job goes on.
//
// Lifetime: the thread ends when nobody can join any more (every rank has joined, or the rendezvous failed: for a
// unique id's own root, at least min(CHORUS_TIMEOUT_MS, 60 s) ago, so that a late joiner is told why) and every
// rank that joined has said goodbye or died; until then it lives as long as the process. A unique id that is
// created but never joined keeps its thread (and port) until the process exits.
//
// Frames, both directions: a 24-byte header (big-endian) followed by `length` payload bytes.
//   u32 type | i32 from | i32 to | u32 tag | u64 length
// Rank -> root (payload at most kMaxRankPayload bytes; anything else closes the connection with a warning):
//   Join         from = rank, to = nranks, payload = the rank's info blob
//   Allgather    from = rank, tag, payload = blob           (k-th Allgather on a tag matches every rank's k-th)
//   Barrier      from = rank, tag, empty                    (its own tag space, apart from Allgather's)
//   P2p          from = rank, to = peer, tag, payload = blob
//   Error        from = rank, payload = text                (broadcast to every rank as Failure)
//   Bye          from = rank                                (clean exit; the root closes the connection)
//   StatusQuery  from = rank                                (answered with Status: who is missing)
// Root -> rank (payload at most kMaxRootPayload bytes):
//   Rendezvous       payload = blob list of every rank's Join blob (see encode_blobs)
//   AllgatherResult  tag, payload = blob list
//   BarrierResult    tag, empty
//   Deliver          from = sender, tag, payload = blob
//   Failure          from = failed or reporting rank, payload = text
//   Reject           tag = chorusResult_t, payload = text   (a refused Join; the root then closes the connection)
//   Status           payload = text
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"

namespace chorus {

enum class MsgType : uint32_t {
  Join = 1,
  Allgather = 2,
  Barrier = 3,
  P2p = 4,
  Error = 5,
  Bye = 6,
  StatusQuery = 7,
  Rendezvous = 16,
  AllgatherResult = 17,
  BarrierResult = 18,
  Deliver = 19,
  Failure = 20,
  Reject = 21,
  Status = 22,
};
const char* msg_type_name(uint32_t type);

struct FrameHeader {
  uint32_t type = 0;
  int32_t from = -1;
  int32_t to = -1;
  uint32_t tag = 0;
  uint64_t length = 0;
};
inline constexpr size_t kFrameHeaderBytes = 24;
inline constexpr uint64_t kMaxRankPayload = uint64_t{64} << 20;  // one blob from a rank
inline constexpr uint64_t kMaxRootPayload = uint64_t{1} << 30;   // a gathered result sent by the root
inline constexpr uint64_t kMaxTextPayload = uint64_t{64} << 10;  // Error / Failure / Reject / Status text

void encode_header(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]);
FrameHeader decode_header(const uint8_t in[kFrameHeaderBytes]);
// Header and payload in one buffer, ready to send.
std::vector<uint8_t> make_frame(MsgType type, int32_t from, int32_t to, uint32_t tag, const void* payload,
                                size_t bytes);

// Blob list: for each blob, u64 length (big-endian) then its bytes. decode_blobs throws chorusSystemError when the
// payload is not exactly `count` well-formed blobs.
std::vector<uint8_t> encode_blobs(const std::vector<Blob>& blobs);
std::vector<Blob> decode_blobs(std::span<const uint8_t> payload, size_t count);

struct RootOptions {
  // A connection must authenticate and send Join within this time, else it is closed and logged.
  int auth_timeout_ms = 5000;
  // Connections allowed to be authenticating at once; more wait in the listen backlog until some are through (a
  // flood cannot exhaust descriptors).
  int max_pending = 256;
  // The secret is this rendezvous's own (chorusGetUniqueId, a split): once nobody can join, a join from this
  // process that reuses it is refused at once (root_closed_here). False for a launcher's secret, which a process
  // may rightly rendezvous with again (chorusCommInitFromEnv after a failure or a destroy).
  bool one_rendezvous = false;
};

// Binds `bind_addr` (port 0 = ephemeral), starts the service thread and returns the address it is bound to, with
// the real port. Throws chorusSystemError when the address cannot be bound. Thread-safe.
sockaddr_storage start_root(const sockaddr_storage& bind_addr, const Secret& secret, const RootOptions& options = {});

// Root services whose thread is still running in this process (for tests and diagnostics). Thread-safe.
int root_services_running();

// True while a root service with `secret` runs in this process: the rank that says so in its peer info names the
// process whose death takes the root (and every rank's control plane) with it. Thread-safe.
bool root_serving_here(const Secret& secret);

// When this process served the rendezvous of the unique id with `secret` (RootOptions::one_rendezvous) and nobody can
// join it any more (its ranks all joined, it failed, or its service stopped): what happened, for a join that
// reuses the id. Empty otherwise (another process's id, a launcher's secret, or one still gathering; only the most
// recent 4096 ids are remembered). Thread-safe.
std::string root_closed_here(const Secret& secret);
// Of those, true when its rendezvous completed (every rank joined) before it closed. Thread-safe.
bool root_completed_here(const Secret& secret);

}  // namespace chorus

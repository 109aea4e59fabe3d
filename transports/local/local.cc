// local: ranks that are threads of one process. Each connection is a pair of SlotFifos in heap memory, found by
// both sides in a process-wide table keyed by (communicator, rank pair, channel).
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "transports/fifo.h"
#include "transports/transports.h"

namespace chorus {

namespace {

struct LocalPair {
  void* region = nullptr;
  size_t bytes = 0;
  ~LocalPair() { std::free(region); }
};

using PairKey = std::tuple<uint64_t, int, int, int>;  // comm id, lower rank, higher rank, channel

std::mutex g_mu;
std::map<PairKey, std::shared_ptr<LocalPair>> g_pairs;

PairKey key_of(const ConnectSpec& s) {
  return {s.comm_id, std::min(s.rank, s.peer), std::max(s.rank, s.peer), s.channel};
}

class LocalTransport : public Transport {
 public:
  const char* name() const override { return "local"; }
  bool can_connect(const PeerInfo& self, const PeerInfo& peer) const override {
    return self.host_id == peer.host_id && self.process_token == peer.process_token;
  }
  std::vector<std::byte> prepare(const ConnectSpec&) override { return {}; }

  std::unique_ptr<Connection> connect(const ConnectSpec& s, const std::vector<std::byte>&, Deadline) override {
    const size_t one = SlotFifo::region_bytes(s.slot_bytes, s.fifo_depth);
    std::shared_ptr<LocalPair> pair;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto& slot = g_pairs[key_of(s)];
      if (!slot) {
        slot = std::make_shared<LocalPair>();
        slot->bytes = 2 * one;
        slot->region = std::aligned_alloc(4096, (2 * one + 4095) / 4096 * 4096);
        if (slot->region == nullptr)
          throw Error(chorusSystemError, Subsys::Transport, cat("local: cannot allocate ", 2 * one, " bytes"));
        // Region 0 carries lower -> higher, region 1 higher -> lower; initialised before the other side can
        // find the pair.
        auto* base = static_cast<std::byte*>(slot->region);
        SlotFifo(base, s.slot_bytes, s.fifo_depth, true);
        SlotFifo(base + one, s.slot_bytes, s.fifo_depth, true);
      }
      pair = slot;
    }
    auto* base = static_cast<std::byte*>(pair->region);
    const bool lower = s.rank < s.peer;
    SlotFifo send(base + (lower ? 0 : one), s.slot_bytes, s.fifo_depth, false);
    SlotFifo recv(base + (lower ? one : 0), s.slot_bytes, s.fifo_depth, false);
    return std::make_unique<FifoConnection>(s.peer, s.channel, s.slot_bytes, send, recv, pair);
  }

  void finish(const ConnectSpec& s) override {
    std::lock_guard<std::mutex> lock(g_mu);
    g_pairs.erase(key_of(s));
  }
};

}  // namespace

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

}  // namespace chorus

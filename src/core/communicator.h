// The communicator: owns the bootstrap, the transports and connections, stamps every call with a sequence number
// and fingerprint, fetches the program and runs it with the executor, inline (blocking calls) or on its worker
// thread (non-blocking calls). Operations complete in the order they were issued.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/program.h"
#include "algorithms/selector.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/unique_id.h"
#include "core/error.h"
#include "kernels/cpu/codec.h"
#include "kernels/cpu/reduce.h"
#include "runtime/executor.h"
#include "transports/transport.h"

namespace chorus {

struct P2POp {
  bool is_send = false;
  int peer = 0;
  void* buf = nullptr;
  size_t count = 0;
  chorusDataType_t dtype = chorusUint8;
};

// One call's arguments, validated by CommImpl::validate before anything runs.
struct CollArgs {
  algo::Coll coll = algo::Coll::AllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements: all-reduce/broadcast/reduce: count; all-gather: per rank in;
                     // reduce-scatter: per rank out; all-to-all: per peer
  chorusDataType_t dtype = chorusFloat32;
  chorusRedOp_t op = chorusSum;
  int root = 0;
  // A pre-multiplied sum's scalar, resolved by validate() so the call does not depend on the op's lifetime.
  bool premul = false;
  double premul_f = 1.0;
  int64_t premul_i = 1;
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;  // all-to-allv
  std::vector<P2POp> p2p;                                        // send/recv group
  std::string algorithm;  // per-call choice (chorusCollOptions_t::algorithm); empty: the selector chooses
  // chorusCollOptions_t::compression, copied (the residual stays the caller's).
  bool compressed = false;
  kernels::codec::Codec codec;
  uint64_t codec_step = 0;
  float* error_feedback = nullptr;
  size_t error_feedback_elems = 0;
  // Set by CommImpl::run_widened on the float32 call it makes for a call on narrower float data: the caller's
  // datatype, which the call's messages carry so that ranks passing different datatypes get a mismatch
  // error. chorusNumTypes: not a widened call.
  chorusDataType_t widened_from = chorusNumTypes;
};

// Completion state of one operation (a chorusRequest_t points to one).
struct RequestState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  chorusResult_t result = chorusSuccess;
  std::string error;
};

class CommImpl;

// What a stream's host function holds instead of the communicator itself: the communicator clears it as it dies, so
// a call the stream reaches only later (one an abort released, or a graph replayed after the destroy) finds it gone
// instead of freed memory. Hold `mu` while using `comm`.
struct CommLifeline {
  std::mutex mu;
  CommImpl* comm = nullptr;
};

class CommImpl {
 public:
  // Joins the rendezvous. Throws chorus::Error. `topology`: the machine view of this communicator's ranks, given by
  // a split from its parent's (Topology::subset); null: built from what the ranks publish and CHORUS_TOPO_FILE /
  // CHORUS_TUNE_FILE. `check_stop`: see Bootstrap::join (a split passes its parent's check_abort).
  CommImpl(const UniqueIdData& id, int nranks, int rank, const topo::Topology* topology = nullptr,
           const std::function<void()>& check_stop = {});
  ~CommImpl();  // waits for queued work, says goodbye
  CommImpl(const CommImpl&) = delete;
  CommImpl& operator=(const CommImpl&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  std::shared_ptr<CommLifeline> lifeline() const { return lifeline_; }
  // Why a wait outside the executor (the device-direct path's) must stop now: this communicator is being aborted,
  // or a peer failed or died (as the bootstrap heard). Empty while neither. Cheap to poll.
  std::string stop_reason() const;

  // Throws chorusInvalidArgument naming the bad argument; touches no buffer. Resolves pre-multiplied sums.
  void validate(CollArgs& a) const;
  // One point-to-point call's own arguments (datatype, peer, count, buffer): checked when it is made, also inside a
  // group, whose set (self-sends against self-receives) validate() checks at chorusGroupEnd.
  void validate_p2p_op(const P2POp& op) const;
  // Compressed calls: the schedule (named or default), the checks of the options, the residual's length.
  const algo::AlgorithmInfo& compressed_algorithm(const CollArgs& a) const;
  void validate_compression(const CollArgs& a) const;
  size_t error_feedback_elems(const CollArgs& a) const;
  // Runs a validated call to completion in this thread (after queued non-blocking work). Throws on failure.
  void run_blocking(CollArgs a);
  // Queues a validated call for the worker thread.
  std::shared_ptr<RequestState> submit(CollArgs a);

  // Stream-ordered calls (device buffers on a CUDA stream, src/runtime/cuda_stream.h). reserve() takes the call's
  // place in this communicator's order now, from the issuing thread: it runs after everything issued before it and
  // before everything issued after it, blocking calls included, which wait for it. post() fills the place in later,
  // from any thread (a CUDA host function), and the worker runs it. `on_done(result)` runs on the worker thread once
  // the call finished or failed; it must not block or call CUDA. A reserved place that is never posted holds every
  // later call of the communicator (and its destruction) back.
  // Every reserved place is completed once, by the worker (its on_done): posted, or failed by an abort (a place
  // reserved after abort() fails at once) or by the destructor (no post can come then). post() returns false, and
  // does nothing, for a place an abort already failed.
  std::shared_ptr<RequestState> reserve(std::function<void(chorusResult_t)> on_done);
  bool post(const std::shared_ptr<RequestState>& place, CollArgs a);
  // Fails a reserved place that will not be posted after all (its on_done runs, with an error). Never throws.
  void fail_place(const std::shared_ptr<RequestState>& place) noexcept;
  // Gives up a reserved place that will never be posted: true if it was withdrawn (its on_done will not run);
  // false if an abort had already failed it (its on_done runs, or ran).
  bool cancel(const std::shared_ptr<RequestState>& place);

  // Bytes this rank reads from the send buffer and writes to the receive buffer in a validated call (0 for a buffer
  // the rank does not use; point-to-point and barrier: 0, 0).
  struct Extents {
    size_t send = 0, recv = 0;
  };
  Extents extents(const CollArgs& a) const;

  // New communicator of the ranks with the same color, ordered by (key, rank); nullptr for CHORUS_SPLIT_NOCOLOR.
  std::unique_ptr<CommImpl> split(int color, int key, bool has_newcomm);

  chorusRedOp_t create_premul(const void* scalar, chorusDataType_t dtype);
  void destroy_premul(chorusRedOp_t op);

  // Local abort: in-flight work fails promptly; peers see this rank as failed. Returns once no API call is inside
  // the communicator (bounded: executors poll the abort flag at least every millisecond).
  void abort();
  // Waits until no queued or running non-blocking work is left (each piece ends by itself: done, failed, or at its
  // deadline; an abort() from another thread ends it at once). chorusCommDestroy calls it while the communicator
  // can still be found by an abort.
  void drain() const;
  // chorusSuccess while healthy, else the error that broke the communicator.
  chorusResult_t async_error(std::string* text) const;
  // Marks the communicator broken with `e` (the first error stays): later calls fail with it.
  void break_with(const Error& e) { fail(e); }

  // For the device-direct path (src/runtime/cuda_local.h): whether every rank is a thread of this process, the
  // communicator's id (equal on every rank), the next number of a call that bypasses the program executor (equal
  // on every rank for the same call), and the timeout for waiting on peers (milliseconds).
  bool all_ranks_in_this_process() const;
  // True when the call runs as a float32 call on widened copies of its data (run_widened): compressed calls on
  // fp16/bf16 data, and, with CHORUS_FP32_PARTIALS=1, reductions of fp16/bf16/fp8 data other than min and max.
  bool widens(const CollArgs& a) const;
  // Whether every rank is on this host and each in a process of its own (the device-direct path over CUDA IPC).
  bool ranks_are_processes_on_this_host() const;
  uint64_t comm_id() const { return comm_id_; }
  uint64_t next_direct_seq() { return direct_seq_++; }
  // State the device-direct path keeps per communicator (its CUDA events), released with the communicator.
  std::shared_ptr<void>& device_state() { return device_state_; }
  int64_t timeout_ms() const { return timeout_ms_; }
  // What the last call ran, for Chorus's own tools (the perf tools print it per size): the wire id of an algorithm
  // of either table (algorithms.h; for a call that widens, its float32 call's), kDeviceDirect for the device-direct
  // path (src/runtime/cuda_local.h), kNoAlgorithm before any call and after a point-to-point call. Written by the
  // thread that runs the call; for calls on a CUDA stream that is a stream's worker when the call starts, but the
  // caller when it enqueues a device-direct call, so among stream calls still in flight the order may differ.
  // Read from any thread.
  static constexpr int kNoAlgorithm = -1;
  static constexpr int kDeviceDirect = -2;
  void note_algorithm(int id) { last_algorithm_.store(id, std::memory_order_relaxed); }
  // The algorithm's name, "device-direct", or "" (kNoAlgorithm).
  std::string last_algorithm() const;
  // The reduction of a validated reduction call: dtype, kind, pre-multiplied scalar, avg divisor.
  kernels::ReduceSpec reduce_spec(const CollArgs& a) const;

  // One-thread-at-a-time guard for the public API (misuse is chorusInvalidUsage).
  class Guard {
   public:
    explicit Guard(CommImpl& c);
    ~Guard();

   private:
    CommImpl& c_;
  };

 private:
  void check_overlap(const CollArgs& a) const;
  // The communicator's topology: CHORUS_TOPO_FILE when set, else hosts from the peers' host identities; link costs
  // from the defaults, the file and CHORUS_TUNE_FILE. The same on every rank (built from all-gathered data).
  topo::Topology make_topology() const;
  void run(const CollArgs& a);
  void run_call(const CollArgs& a, WireHeader& hdr);
  // A call that widens() (a compressed call on fp16 or bf16 data, or a narrow-float reduction with
  // CHORUS_FP32_PARTIALS=1): widens the input to float32 (exact), runs the float32 call, and rounds its result to
  // the caller's type once (nearest-even), so every rank ends with the same bits.
  void run_widened(const CollArgs& a, WireHeader& hdr);
  [[noreturn]] void fail_call(const Error& e, const WireHeader& hdr);
  // Connects every (peer, channel) in `needed` not connected yet; the handshake carries `call`'s header, so a peer in
  // a different call is reported as a mismatch instead of waiting for a connection it will never make.
  void ensure_connections(const std::vector<std::pair<int, int>>& needed, const WireHeader& call, Deadline deadline);
  Transport& choose_transport(int peer);
  void check_abort() const;
  // Throws the error that broke this communicator, if one did: every later call returns it, unchanged.
  void throw_if_broken() const;
  // Throws chorusRemoteError naming the peer when a message of a peer waits here for this very call (same sequence
  // number) with another fingerprint: data at the head of a connection, or a request for a connection. A peer
  // running another program (another root, say) may need connections this rank's does not, or none it waits for,
  // so the two would otherwise wait for each other until the deadline. Called while waiting.
  void check_peer_calls(const WireHeader& call) const;
  // The leave notes peers have sent (Bootstrap::leave_note): (rank, its collective count when it destroyed).
  std::vector<std::pair<int, uint64_t>> leave_notes() const;
  // Calls visit(peer, header) for every message header peers have sent that waits here: at the head of each open
  // connection, and each connection request queued in the bootstrap. Never blocks.
  void for_each_waiting_header(const std::function<void(int, const WireHeader&)>& visit) const;
  // While waiting for `peer` to connect for collective `call`: throws chorusRemoteError when `peer` has sent
  // anything of a later collective. With the same arguments it would need the same connection, so it could not
  // have finished `call` without it: it called `call` with other arguments. For a point-to-point `call`: throws
  // when `peer` has destroyed its communicator (its leave note, which the root also sends to whoever asks it to
  // relay a message to a rank that has left).
  void check_gone_past(int peer, const WireHeader& call) const;
  void fail(const Error& e);
  // The bootstrap's failure, naming the rank whose process hosted the root when the root's connection closed.
  PeerFailure peer_failure() const;
  // What a call sees when the bootstrap has heard of a failure: "rank R: peer failure: ...", naming the failed rank.
  std::string peer_failure_text() const;
  // The same without "rank R: peer failure: ": the failed rank and what happened.
  std::string peer_failure_what() const;
  void worker_loop();
  // Every place still waiting for its post fails (the worker completes it: its on_done runs). Hold q_mu_.
  void fail_unposted_places();

  int rank_ = 0, nranks_ = 0;
  uint64_t comm_id_ = 0;
  Secret secret_{};
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<PeerInfo> peers_;
  std::map<std::pair<int, int>, std::unique_ptr<Connection>> conns_;
  // Per cached program: the connection of every step and the set of connections to pump.
  struct Wiring {
    std::vector<std::vector<StepConns>> conns;
    std::vector<Connection*> all_conns;
  };
  std::map<const algo::RankProgram*, Wiring> wirings_;
  // Chooses every collective's algorithm from the topology (fixed at init: the same on every rank).
  // Shared by the thread-ranks of this communicator in this process (the same topology, settings and rules): each
  // decision is simulated once per process, not once per rank.
  std::shared_ptr<algo::Selector> selector_;
  size_t slice_bytes_ = 0;
  int fifo_depth_ = 0;
  int nchannels_ = 1;
  bool oversubscribed_ = false;  // more ranks on this host than CPUs
  bool fp32_partials_ = false;   // CHORUS_FP32_PARTIALS
  int yield_us_ = 1000;
  int64_t timeout_ms_ = 0;
  uint64_t seq_ = 0;
  // How far this rank is, for peers' status questions (answered from the bootstrap's service thread): the last
  // collective started, and what runs now.
  enum Activity : uint8_t { kIdle = 0, kInCollective = 1, kInSplit = 2, kInPointToPoint = 3 };
  std::atomic<uint64_t> started_{0};
  std::atomic<uint8_t> activity_{kIdle};
  // After a timeout in collective `call` (or, null, in chorusCommSplit): asks every peer how far it is (about 1 s)
  // and says which had not called it, which had left and which did not answer (`suffix`, "; ..."), or nothing when
  // it cannot ask. `lead` is set instead of a clause of the suffix when the silent ranks are the likely cause
  // (every rank that answered had called it): a stopped rank, not the neighbour this rank waited for.
  struct Diagnosis {
    std::string lead, suffix;
    std::string lead_key;  // the lead without its timings: equal on every rank that diagnoses the same silent ranks
    // A point-to-point call's: a peer of its group, still there, was in no point-to-point call or did not answer.
    bool group_peer_stuck = false;
  };
  Diagnosis diagnose_timeout(const WireHeader* call);
  uint64_t direct_seq_ = 0;  // calls of the device-direct path
  std::atomic<int> last_algorithm_{kNoAlgorithm};
  std::shared_ptr<void> device_state_;
  // Reused for the communicator's life (fresh pages cost more than the copies, MACHINE-NOTES.md):
  std::vector<std::byte> staging_;  // inputs staged for in-place all-to-all and grouped send/recv
  std::vector<std::byte> scratch_;  // programs' scratch buffer
  std::vector<float> widened_;      // calls that widen(): the input and output as float32
  std::vector<int> p2p_peers_;      // the peers of the point-to-point group running (or last run), for its errors

  struct PreMul {
    double f = 1.0;
    int64_t i = 1;
    chorusDataType_t dtype = chorusFloat32;
  };
  std::map<int, PreMul> premul_;  // by op id, unique in the process (create_premul)

  std::atomic<bool> aborted_{false};
  mutable std::mutex err_mu_;
  chorusResult_t broken_ = chorusSuccess;
  std::atomic<bool> is_broken_{false};  // broken_ != chorusSuccess, readable without the mutex
  std::string broken_text_;

  std::atomic<int> pending_{0};  // queued or running non-blocking work
  std::shared_ptr<CommLifeline> lifeline_ = std::make_shared<CommLifeline>();
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  struct Work {
    CollArgs args;
    std::shared_ptr<RequestState> req;
    bool ready = true;     // false: reserved, not posted yet
    bool aborted = false;  // abort() came before the post: fails without running
    std::function<void(chorusResult_t)> on_done;
  };
  std::deque<Work> queue_;    // runs from the front, a reserved place only once posted
  bool inline_busy_ = false;  // run_blocking runs a call on its own thread: the worker waits (under q_mu_)
  bool stop_ = false;
  std::thread worker_;
  std::atomic<std::thread::id> owner_{};
};

// For Chorus's own tools, not the public API: CommImpl::last_algorithm() of `comm`; "" for a NULL or destroyed
// communicator. Thread-safe.
std::string last_algorithm(chorusComm_t comm);

}  // namespace chorus

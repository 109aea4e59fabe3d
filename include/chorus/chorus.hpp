// Chorus C++ API: a thin header-only layer over the C ABI (chorus.h). Errors throw chorus::CommError carrying the
// result code and chorusGetLastError's text. Element types map to datatypes at compile time (chorus::dtype_of);
// for fp16, bf16 and fp8 pass the chorus::half / bfloat16 / float8_e4m3 / float8_e5m2 storage types.
//
// Thread-safety: as for the C API: one communicator is driven by one thread at a time.
//
//   chorus::UniqueId id = chorus::UniqueId::create();         // on one process; share the 128 bytes
//   chorus::Comm comm(nranks, id, rank);
//   std::vector<float> grad(n);
//   comm.all_reduce(std::span<float>(grad), chorus::Op::Sum); // in place
//   chorus::Request r = comm.iall_gather(std::span<const float>(shard), std::span<float>(full));  // non-blocking
//   r.wait();
#pragma once

// GCC 10 reports 201709L under -std=c++20.
#if __cplusplus < 201709L
#error "chorus.hpp needs C++20 (std::span): compile with -std=c++20, or use the C API of chorus.h"
#endif

#include <chorus/chorus.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace chorus {

class CommError : public std::runtime_error {
 public:
  CommError(chorusResult_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  chorusResult_t code() const { return code_; }

 private:
  chorusResult_t code_;
};

inline void check(chorusResult_t r, chorusComm_t comm = nullptr) {
  if (r != chorusSuccess) throw CommError(r, std::string(chorusGetErrorString(r)) + ": " + chorusGetLastError(comm));
}

// Storage types for the 16- and 8-bit floating formats (bit patterns; convert with your framework's helpers).
struct half {
  uint16_t bits;
};
struct bfloat16 {
  uint16_t bits;
};
struct float8_e4m3 {
  uint8_t bits;
};
struct float8_e5m2 {
  uint8_t bits;
};

template <typename T>
constexpr chorusDataType_t dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, int8_t>)
    return chorusInt8;
  else if constexpr (std::is_same_v<U, uint8_t>)
    return chorusUint8;
  else if constexpr (std::is_same_v<U, int32_t>)
    return chorusInt32;
  else if constexpr (std::is_same_v<U, uint32_t>)
    return chorusUint32;
  else if constexpr (std::is_same_v<U, int64_t>)
    return chorusInt64;
  else if constexpr (std::is_same_v<U, uint64_t>)
    return chorusUint64;
  else if constexpr (std::is_same_v<U, float>)
    return chorusFloat32;
  else if constexpr (std::is_same_v<U, double>)
    return chorusFloat64;
  else if constexpr (std::is_same_v<U, half>)
    return chorusFloat16;
  else if constexpr (std::is_same_v<U, bfloat16>)
    return chorusBfloat16;
  else if constexpr (std::is_same_v<U, float8_e4m3>)
    return chorusFloat8e4m3;
  else if constexpr (std::is_same_v<U, float8_e5m2>)
    return chorusFloat8e5m2;
  else
    static_assert(sizeof(T) == 0, "no Chorus datatype for this element type");
}

enum class Op : int { Sum = chorusSum, Prod = chorusProd, Max = chorusMax, Min = chorusMin, Avg = chorusAvg };

// Per-call options of the blocking collectives (chorusCollOptions_t). `algorithm`: a name chorus-info lists for the
// collective ("ring", "tree", "rhd", "bruck", "pat", "hier", ...), or nullptr for the selector's choice; every rank
// must pass the same. An unknown name throws CommError (chorusInvalidArgument) listing the known ones.
// `compression`: compressed all_reduce / reduce_scatter / all_gather of float (chorus.h, chorusCompression_t;
// start from Compression(codec)); `algorithm` then names a compressed schedule ("qonce", "qonce-flat", "ring", "hier")
// or is nullptr for the default. The compression struct, and its error-feedback residual, stay the caller's.
struct CallOptions {
  const char* algorithm = nullptr;
  const chorusCompression_t* compression = nullptr;
  chorusCollOptions_t c() const {
    chorusCollOptions_t o = CHORUS_COLL_OPTIONS_INIT;
    o.algorithm = algorithm;
    o.compression = compression;
    return o;
  }
};

// A chorusCompression_t for `codec` with every other field at its default (CHORUS_COMPRESSION_INIT).
inline chorusCompression_t Compression(chorusCodec_t codec) {
  chorusCompression_t z = CHORUS_COMPRESSION_INIT(codec);
  return z;
}

class UniqueId {
 public:
  // Starts the rendezvous service in this process (keep it alive until every rank has joined).
  static UniqueId create() {
    UniqueId id;
    check(chorusGetUniqueId(&id.raw));
    return id;
  }
  chorusUniqueId raw{};
};

// A non-blocking operation. Move-only; the destructor waits for it (a request must not outlive its buffers).
class Request {
 public:
  Request() = default;
  explicit Request(chorusRequest_t r) : r_(r) {}
  Request(Request&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      reset();
      r_ = std::exchange(o.r_, nullptr);
    }
    return *this;
  }
  ~Request() { reset(); }
  // True once complete; throws CommError if the operation failed.
  bool test() {
    int done = 0;
    check(chorusTest(r_, &done));
    return done != 0;
  }
  // Waits until the operation ends (bounded by its own deadline, see chorusWait); throws CommError if it failed.
  void wait() { check(chorusWait(r_, -1)); }
  // Waits up to timeout_ms milliseconds (>= 0): true once complete, false if it is still running (the buffers are
  // not ready); throws CommError if the operation failed (its own timeout included).
  [[nodiscard]] bool wait_for(int64_t timeout_ms) {
    const chorusResult_t r = chorusWait(r_, timeout_ms < 0 ? 0 : timeout_ms);
    if (r == chorusInProgress) return false;
    check(r);
    return true;
  }

 private:
  void reset() {
    if (r_) chorusRequestFree(r_);
    r_ = nullptr;
  }
  chorusRequest_t r_ = nullptr;
};

class Comm {
 public:
  Comm(int nranks, const UniqueId& id, int rank) { check(chorusCommInitRank(&c_, nranks, id.raw, rank)); }
  // From the launcher's environment (chorusrun, torchrun, mpirun, srun).
  static Comm from_env() {
    chorusComm_t c = nullptr;
    check(chorusCommInitFromEnv(&c));
    return Comm(c);
  }
  // Every rank of a new job in this process (ranks as threads): element r is rank r.
  static std::vector<Comm> all(int nranks) {
    std::vector<chorusComm_t> c(nranks > 0 ? static_cast<size_t>(nranks) : 0);
    check(chorusCommInitAll(c.data(), nranks));
    std::vector<Comm> out;
    out.reserve(c.size());
    for (chorusComm_t h : c) out.push_back(Comm(h));
    return out;
  }
  Comm(Comm&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Comm& operator=(Comm&& o) noexcept {
    if (this != &o) {
      destroy();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }
  ~Comm() { destroy(); }

  int rank() const {
    int r = -1;
    check(chorusCommUserRank(c_, &r), c_);
    return r;
  }
  int size() const {
    int n = 0;
    check(chorusCommCount(c_, &n), c_);
    return n;
  }
  chorusComm_t handle() const { return c_; }
  // Collective: ranks with the same color form a new communicator ordered by (key, rank). A rank passing
  // CHORUS_SPLIT_NOCOLOR gets an empty Comm (valid() == false).
  Comm split(int color, int key) {
    chorusComm_t n = nullptr;
    check(chorusCommSplit(c_, color, key, &n), c_);
    return Comm(n);
  }
  bool valid() const { return c_ != nullptr; }
  // Local abort: outstanding work fails; peers see this rank as failed. It clears this object's handle, so call it
  // from the thread that uses the object; a watchdog thread calls chorusCommAbort(handle()) instead (chorus.h), and
  // this object's later calls fail with CommError (chorusInvalidUsage).
  void abort() {
    if (c_) chorusCommAbort(std::exchange(c_, nullptr));
  }

  // Inputs are std::span<const T> and outputs std::span<T>, so T is deduced from both: pass
  // std::span<const float>(x) for an input (or name T: all_reduce<float>(x, y) converts vectors and spans).
  // Sizes are element counts of the spans: all_reduce: in.size() == out.size(); reduce: the same on the root (out is
  // not touched elsewhere); all_gather: out = size() * in;
  // reduce_scatter: in = size() * out; all_to_all: in.size() == out.size() == size() * per-peer count; all_to_allv:
  // per-peer counts and displacements.
  template <typename T>
  void all_reduce(std::span<const T> in, std::span<T> out, Op op = Op::Sum, const CallOptions& opt = {}) {
    expect(in.size() == out.size(), "all_reduce: in and out sizes differ");
    const chorusCollOptions_t o = opt.c();
    check(chorusAllReduceEx(in.data(), out.data(), in.size(), dtype_of<T>(), red(op), &o, c_, nullptr), c_);
  }
  template <typename T>
  void all_reduce(std::span<T> inout, Op op = Op::Sum, const CallOptions& opt = {}) {
    const chorusCollOptions_t o = opt.c();
    check(chorusAllReduceEx(inout.data(), inout.data(), inout.size(), dtype_of<T>(), red(op), &o, c_, nullptr), c_);
  }
  template <typename T>
  void broadcast(std::span<T> buf, int root, const CallOptions& opt = {}) {
    const chorusCollOptions_t o = opt.c();
    check(chorusBroadcastEx(buf.data(), buf.data(), buf.size(), dtype_of<T>(), root, &o, c_, nullptr), c_);
  }
  template <typename T>
  void reduce(std::span<const T> in, std::span<T> out, int root, Op op = Op::Sum, const CallOptions& opt = {}) {
    // Only the root writes `out`; elsewhere it may be empty.
    expect(rank() != root || out.size() == in.size(), "reduce: on the root, in and out sizes differ");
    const chorusCollOptions_t o = opt.c();
    check(chorusReduceEx(in.data(), out.data(), in.size(), dtype_of<T>(), red(op), root, &o, c_, nullptr), c_);
  }
  template <typename T>
  void all_gather(std::span<const T> in, std::span<T> out, const CallOptions& opt = {}) {
    expect(out.size() == in.size() * static_cast<size_t>(size()), "all_gather: out must hold size() * in");
    const chorusCollOptions_t o = opt.c();
    check(chorusAllGatherEx(in.data(), out.data(), in.size(), dtype_of<T>(), &o, c_, nullptr), c_);
  }
  template <typename T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, Op op = Op::Sum, const CallOptions& opt = {}) {
    expect(in.size() == out.size() * static_cast<size_t>(size()), "reduce_scatter: in must hold size() * out");
    const chorusCollOptions_t o = opt.c();
    check(chorusReduceScatterEx(in.data(), out.data(), out.size(), dtype_of<T>(), red(op), &o, c_, nullptr), c_);
  }
  template <typename T>
  void all_to_all(std::span<const T> in, std::span<T> out, const CallOptions& opt = {}) {
    const size_t n = static_cast<size_t>(size());
    expect(in.size() == out.size() && in.size() % n == 0, "all_to_all: sizes must be equal multiples of size()");
    const chorusCollOptions_t o = opt.c();
    check(chorusAllToAllEx(in.data(), out.data(), in.size() / n, dtype_of<T>(), &o, c_, nullptr), c_);
  }
  // gather: on the root, out = size() * in (rank r's block at r * in.size()); elsewhere out is not touched and may
  // be empty. scatter: on the root, in = size() * out (block r to rank r); elsewhere in is not read and may be empty.
  template <typename T>
  void gather(std::span<const T> in, std::span<T> out, int root, const CallOptions& opt = {}) {
    expect(rank() != root || out.size() == in.size() * static_cast<size_t>(size()),
           "gather: on the root, out must hold size() * in");
    const chorusCollOptions_t o = opt.c();
    check(chorusGatherEx(in.data(), out.data(), in.size(), dtype_of<T>(), root, &o, c_, nullptr), c_);
  }
  template <typename T>
  void scatter(std::span<const T> in, std::span<T> out, int root, const CallOptions& opt = {}) {
    expect(rank() != root || in.size() == out.size() * static_cast<size_t>(size()),
           "scatter: on the root, in must hold size() * out");
    const chorusCollOptions_t o = opt.c();
    check(chorusScatterEx(in.data(), out.data(), out.size(), dtype_of<T>(), root, &o, c_, nullptr), c_);
  }
  // Counts and displacements are in elements, one per rank: the send_counts[j] elements of `in` at send_displs[j] go
  // to rank j, which receives them at recv_displs[this rank] of its `out`. Every block must lie inside its span.
  template <typename T>
  void all_to_allv(std::span<const T> in, std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                   std::span<T> out, std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) {
    const size_t n = static_cast<size_t>(size());
    expect(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n && recv_displs.size() == n,
           "all_to_allv: counts and displacements need one entry per rank");
    for (size_t j = 0; j < n; ++j)
      expect(send_displs[j] <= in.size() && send_counts[j] <= in.size() - send_displs[j] &&
                 recv_displs[j] <= out.size() && recv_counts[j] <= out.size() - recv_displs[j],
             "all_to_allv: a block lies outside its buffer");
    check(chorusAllToAllv(in.data(), send_counts.data(), send_displs.data(), out.data(), recv_counts.data(),
                          recv_displs.data(), dtype_of<T>(), c_, nullptr),
          c_);
  }
  void barrier() { check(chorusBarrier(c_, nullptr), c_); }
  template <typename T>
  void send(std::span<const T> buf, int peer) {
    check(chorusSend(buf.data(), buf.size(), dtype_of<T>(), peer, c_, nullptr), c_);
  }
  template <typename T>
  void recv(std::span<T> buf, int peer) {
    check(chorusRecv(buf.data(), buf.size(), dtype_of<T>(), peer, c_, nullptr), c_);
  }

  // Non-blocking forms take the same CallOptions (read before the call returns; a compression's residual is used
  // while the request runs).
  template <typename T>
  Request iall_reduce(std::span<const T> in, std::span<T> out, Op op = Op::Sum, const CallOptions& opt = {}) {
    expect(in.size() == out.size(), "iall_reduce: in and out sizes differ");
    chorusRequest_t r = nullptr;
    const chorusCollOptions_t o = opt.c();
    check(chorusIallReduceEx(in.data(), out.data(), in.size(), dtype_of<T>(), red(op), &o, c_, &r), c_);
    return Request(r);
  }
  template <typename T>
  Request iall_gather(std::span<const T> in, std::span<T> out, const CallOptions& opt = {}) {
    expect(out.size() == in.size() * static_cast<size_t>(size()), "iall_gather: out must hold size() * in");
    chorusRequest_t r = nullptr;
    const chorusCollOptions_t o = opt.c();
    check(chorusIallGatherEx(in.data(), out.data(), in.size(), dtype_of<T>(), &o, c_, &r), c_);
    return Request(r);
  }
  template <typename T>
  Request ireduce_scatter(std::span<const T> in, std::span<T> out, Op op = Op::Sum, const CallOptions& opt = {}) {
    expect(in.size() == out.size() * static_cast<size_t>(size()), "ireduce_scatter: in must hold size() * out");
    chorusRequest_t r = nullptr;
    const chorusCollOptions_t o = opt.c();
    check(chorusIreduceScatterEx(in.data(), out.data(), out.size(), dtype_of<T>(), red(op), &o, c_, &r), c_);
    return Request(r);
  }

 private:
  explicit Comm(chorusComm_t c) : c_(c) {}
  static chorusRedOp_t red(Op op) { return static_cast<chorusRedOp_t>(op); }
  static void expect(bool ok, const char* what) {
    if (!ok) throw CommError(chorusInvalidArgument, what);
  }
  void destroy() {
    if (c_) chorusCommDestroy(std::exchange(c_, nullptr));
  }
  chorusComm_t c_ = nullptr;
};

// Batches sends, receives and blocking collectives: everything between construction and destruction is issued
// together at chorusGroupEnd (see chorus.h).
class Group {
 public:
  Group() { check(chorusGroupStart()); }
  ~Group() noexcept(false) {
    chorusResult_t r = chorusGroupEnd();
    if (r != chorusSuccess && std::uncaught_exceptions() == 0) check(r);
  }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
};

}  // namespace chorus

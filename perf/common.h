// Shared harness of the perf tools: nccl-tests-compatible flags, sweep, timing, checking and output.
//
// Each tool is one small Collective descriptor (how to size buffers for a row, run one operation and predict each
// output element) handed to perf_main. The harness never knows which collective it runs; the communication it
// needs for itself (barrier, reducing the timings, gathering rank descriptions) goes through a Backend, so the
// Open MPI baseline in compare/ runs the very same sweep, data and checks over MPI.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace chorus::perf {

// Exit codes shared by every tool.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // wrong results or a failed call
constexpr int kExitUsage = 2;   // bad flag or value

// Reduction operators the tools sweep. PreMulSum is created per communicator and dtype with scalar
// kPreMulScalar, a power of two so that the scaled results stay exact in every dtype.
enum class Op { None, Sum, Prod, Max, Min, Avg, PreMulSum };
constexpr int64_t kPreMulScalar = 2;

const char* op_name(Op op);
const char* dtype_name(chorusDataType_t dtype);

// How per-rank times become one reported time (nccl-tests -a): rank 0's own, or the average, minimum or maximum
// over ranks.
enum class Average { Rank0 = 0, Avg = 1, Min = 2, Max = 3 };

struct Options {
  size_t min_bytes = size_t{32} << 20;
  size_t max_bytes = size_t{32} << 20;
  size_t step_bytes = size_t{1} << 20;
  int step_factor = 0;  // 0: add step_bytes; >1: multiply
  int iters = 20;
  int warmup_iters = 5;
  int check_iters = 1;  // 0 disables checking
  std::vector<chorusDataType_t> dtypes{chorusFloat32};
  std::vector<Op> ops{Op::Sum};
  int root = 0;  // -1: every root in turn
  bool blocking = false;
  Average average = Average::Avg;
  int nthreads = 1;
  int ngpus = 1;
  int cycles = 1;
  int timeout_s = 0;  // 0: the library's default (CHORUS_TIMEOUT_MS)
  bool report_cputime = false;
  std::string json_path;
  std::string algorithm;  // -A: forced for every call; empty: the selector chooses
  // -Z codec[:block]: compressed calls (chorusCompression_t); 0 = none. Inputs become pseudo-normal floats and the
  // check reports the relative L2 error against an fp64 reference instead of counting exact mismatches.
  int compression = 0;  // chorusCodec_t
  uint32_t compression_block = 0;
  bool compression_rotation = false;  // -Z ...:rht
};

// What one tool accepts: the flags it understands (short letters), and the dtypes and ops "all" expands to.
struct ToolInfo {
  std::string name;  // e.g. "all_reduce_perf"
  std::string flags;
  std::vector<chorusDataType_t> dtypes;
  std::vector<Op> ops;
};

// Every flag of the Chorus tools; ToolInfo::flags may name a subset.
extern const char* const kAllFlags;
ToolInfo chorus_tool(const std::string& name);

// Parses argv into *out. Returns -1 to go on, kExitOk after -h (usage printed), or kExitUsage after a bad flag or
// value (an error naming the flag printed to stderr when `verbose`).
int parse_options(int argc, char** argv, const ToolInfo& tool, Options* out, bool verbose);

// The byte sizes of the sweep, in order.
std::vector<size_t> sweep_sizes(const Options& opts);

// Buffer shapes of one table row for one dtype and rank count.
struct Layout {
  size_t count = 0;       // the count argument of the call (per rank or per block, as the API defines it)
  size_t send_count = 0;  // elements of each rank's input
  size_t recv_count = 0;  // elements of each rank's output
  size_t bytes = 0;       // the "size" column
  size_t elements = 0;    // the "count" column
};

// Where output element i comes from: one rank's input element, every rank's input element `index` reduced, or
// nothing to check (the output is undefined, e.g. reduce on a non-root rank).
struct Expect {
  enum Kind { Copy, Reduce, Skip } kind = Skip;
  int rank = 0;
  size_t index = 0;
};

struct OpArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  bool inplace = false;
  size_t count = 0;
  chorusDataType_t dtype = chorusFloat32;
  Op op = Op::None;
  chorusRedOp_t redop = chorusSum;  // op as the backend knows it (a created handle for PreMulSum)
  int root = -1;
  int rank = 0;
  int nranks = 1;
  chorusComm_t comm = nullptr;                   // null outside the Chorus backend
  const chorusCollOptions_t* options = nullptr;  // per-call options (the -A algorithm)
};

// A failed call: the message names the rank, the call and the library's error text. `usage`: the library refused
// the arguments the flags made (chorusInvalidArgument, chorusNotSupported: an algorithm or codec that does not apply
// to the collective or dtype), so the tool exits kExitUsage as for a bad flag.
class PerfError : public std::runtime_error {
 public:
  explicit PerfError(const std::string& what, bool usage = false) : std::runtime_error(what), usage(usage) {}
  bool usage;
};

// Throws PerfError for anything but chorusSuccess, with chorusGetLastError(comm).
void check_chorus(chorusResult_t result, const char* call, chorusComm_t comm, int rank);

class Collective {
 public:
  virtual ~Collective() = default;
  virtual const char* name() const = 0;  // e.g. "all_reduce"
  virtual bool reduces() const { return false; }
  virtual bool rooted() const { return false; }
  // Whether -Z applies: the library compresses all-reduce, reduce-scatter and all-gather.
  virtual bool compressible() const { return false; }
  virtual Layout layout(size_t bytes, size_t type_size, int nranks) const = 0;
  // In place, input and output share one buffer of max(send_count, recv_count) elements; these are their offsets.
  virtual size_t inplace_send_offset(const Layout& l, int rank) const { return 0; }
  virtual size_t inplace_recv_offset(const Layout& l, int rank) const { return 0; }
  virtual double bus_factor(int nranks) const = 0;
  virtual Expect expect(const Layout& l, int rank, int nranks, int root, size_t i) const = 0;
  // Runs one operation; throws PerfError on failure.
  virtual void run(const OpArgs& a) const = 0;
};

// All-reduce's shape, shared by all_reduce_perf and the baselines (perf/compare) so that all measure and check the
// same thing: every rank ends with the reduction of every rank's `count` elements; a ring moves each byte
// 2(n-1)/n times through every rank's link. Subclasses give run().
class AllReduceShape : public Collective {
 public:
  const char* name() const override { return "all_reduce"; }
  bool reduces() const override { return true; }
  Layout layout(size_t bytes, size_t ts, int) const override {
    const size_t count = bytes / ts;
    return {count, count, count, count * ts, count};
  }
  double bus_factor(int n) const override { return 2.0 * (n - 1) / n; }
  Expect expect(const Layout&, int, int, int, size_t i) const override { return {Expect::Reduce, 0, i}; }
};

// Layouts of `bytes` (the whole gathered buffer) cut in nranks blocks of `count` elements: one block in, all out
// (all-gather, gather), or all in, one block out (reduce-scatter, scatter).
inline Layout gathered_layout(size_t bytes, size_t ts, int nranks) {
  const size_t per = bytes / ts / static_cast<size_t>(nranks), total = per * static_cast<size_t>(nranks);
  return {per, per, total, total * ts, total};
}
inline Layout scattered_layout(size_t bytes, size_t ts, int nranks) {
  const size_t per = bytes / ts / static_cast<size_t>(nranks), total = per * static_cast<size_t>(nranks);
  return {per, total, per, total * ts, total};
}

// Gather: the root ends with every rank's `count` elements, rank r's at block r; size = the root's whole output
// (nccl-tests' gather_perf). In place, each rank's input sits in its own block of the output.
class GatherShape : public Collective {
 public:
  const char* name() const override { return "gather"; }
  bool rooted() const override { return true; }
  Layout layout(size_t bytes, size_t ts, int nranks) const override { return gathered_layout(bytes, ts, nranks); }
  size_t inplace_send_offset(const Layout& l, int rank) const override { return static_cast<size_t>(rank) * l.count; }
  double bus_factor(int n) const override { return static_cast<double>(n - 1) / n; }
  Expect expect(const Layout& l, int rank, int, int root, size_t i) const override {
    if (rank != root) return {Expect::Skip, 0, 0};
    return {Expect::Copy, static_cast<int>(i / l.count), i % l.count};
  }
};

// Scatter: rank r ends with block r of the root's input; size = the root's whole input (nccl-tests' scatter_perf).
// In place, each rank's result lands on its own block of the input.
class ScatterShape : public Collective {
 public:
  const char* name() const override { return "scatter"; }
  bool rooted() const override { return true; }
  Layout layout(size_t bytes, size_t ts, int nranks) const override { return scattered_layout(bytes, ts, nranks); }
  size_t inplace_recv_offset(const Layout& l, int rank) const override { return static_cast<size_t>(rank) * l.count; }
  double bus_factor(int n) const override { return static_cast<double>(n - 1) / n; }
  Expect expect(const Layout& l, int rank, int, int root, size_t i) const override {
    return {Expect::Copy, root, static_cast<size_t>(rank) * l.count + i};
  }
};

// All-to-all: block j of rank r's input ends as block r of rank j's output; size = each rank's whole input
// (nccl-tests' alltoall_perf). In place, the output overwrites the input.
class AllToAllShape : public Collective {
 public:
  const char* name() const override { return "alltoall"; }
  Layout layout(size_t bytes, size_t ts, int nranks) const override {
    const size_t per = bytes / ts / static_cast<size_t>(nranks);
    const size_t total = per * static_cast<size_t>(nranks);
    return {per, total, total, total * ts, total};
  }
  double bus_factor(int n) const override { return static_cast<double>(n - 1) / n; }
  Expect expect(const Layout& l, int rank, int, int, size_t i) const override {
    return {Expect::Copy, static_cast<int>(i / l.count), static_cast<size_t>(rank) * l.count + i % l.count};
  }
};

// The communication the harness needs for itself.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  virtual std::string describe() const = 0;  // one header line: library and how ranks were placed
  virtual void barrier() = 0;
  // Element-wise over ranks (op is Sum, Min or Max); the result lands on every rank.
  virtual void allreduce(double* values, size_t n, Op op) = 0;
  virtual void allgather(const void* in, void* out, size_t bytes) = 0;
  // The reduction handle for (op, dtype); release_op is called when the sweep is done with it.
  virtual chorusRedOp_t acquire_op(Op op, chorusDataType_t dtype) = 0;
  virtual void release_op(chorusRedOp_t redop) {}
  virtual chorusComm_t comm() const { return nullptr; }
  // The algorithm this rank's last collective ran ("" when the library does not say: the baselines).
  virtual std::string last_algorithm() const { return ""; }
  // After a failure on this rank: stop the peers from waiting on it.
  virtual void abort() {}
};

// Runs the whole sweep on this rank (rank 0 prints the table and writes JSON). Returns an exit code.
int run_sweep(const Options& opts, const ToolInfo& tool, const Collective& coll, Backend& backend);

// main() of a Chorus tool: parses flags, creates the ranks (from the launcher's environment, else -t threads of
// this process) and runs the sweep.
int perf_main(int argc, char** argv, const Collective& coll);

}  // namespace chorus::perf

// gloo_allreduce_perf: the all_reduce_perf sweep, data, checks and columns, through Gloo's gloo::allreduce (ring,
// its TCP transport), as PyTorch's CPU backend runs it: the baseline for Chorus's tcp transport. Launch with
// chorusrun (it reads CHORUS_RANK, CHORUS_NRANKS and CHORUS_LAUNCH_ID); the ranks meet through a Gloo FileStore in
// a directory named after the launch. GLOO_IFACE names the interface (default: the loopback address).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common.h"

namespace chorus::perf {
namespace {

// Every Gloo call of this tool, with its failure (a gloo::Exception) turned into a PerfError naming the call.
template <typename F>
void check_gloo(F&& f, const char* call, int rank) {
  try {
    f();
  } catch (const gloo::Exception& e) {
    throw PerfError("rank " + std::to_string(rank) + ": " + call + " failed: " + e.what());
  }
}

template <typename T>
gloo::AllreduceOptions::Func gloo_op(Op op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case Op::Prod: return static_cast<Fn>(&gloo::product<T>);
    case Op::Max: return static_cast<Fn>(&gloo::max<T>);
    case Op::Min: return static_cast<Fn>(&gloo::min<T>);
    default: return static_cast<Fn>(&gloo::sum<T>);
  }
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') throw PerfError(std::string(name) + " is not set: launch with chorusrun");
  return std::stoi(v);
}

class GlooBackend final : public Backend {
 public:
  GlooBackend() : rank_(env_int("CHORUS_RANK")), nranks_(env_int("CHORUS_NRANKS")) {
    const char* launch = std::getenv("CHORUS_LAUNCH_ID");
    dir_ = std::filesystem::temp_directory_path() / ("gloo-perf-" + std::string(launch ? launch : "local"));
    std::filesystem::create_directories(dir_);
    gloo::transport::tcp::attr attr;
    const char* iface = std::getenv("GLOO_IFACE");
    if (iface != nullptr && *iface != '\0')
      attr.iface = iface;
    else
      attr.hostname = "127.0.0.1";
    check_gloo(
        [&] {
          auto dev = gloo::transport::tcp::CreateDevice(attr);
          gloo::rendezvous::FileStore store(dir_.string());
          gloo::rendezvous::PrefixStore prefix("allreduce", store);
          auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, nranks_);
          ctx->setTimeout(std::chrono::minutes(5));  // large sizes on 2 cores take a while
          ctx->connectFullMesh(prefix, dev);
          ctx_ = std::move(ctx);
        },
        "connectFullMesh", rank_);
  }
  ~GlooBackend() override {
    // Everyone connected before the first rank leaves: the store's files are no longer needed.
    if (rank_ == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  std::string describe() const override {
    return "Gloo (libgloo, tcp transport, ring), nranks " + std::to_string(nranks_) + " (" + std::to_string(nranks_) +
           " processes x 1 thread)";
  }
  void barrier() override {
    check_gloo(
        [&] {
          gloo::BarrierOptions opts(ctx_);
          gloo::barrier(opts);
        },
        "gloo::barrier", rank_);
  }
  void allreduce(double* values, size_t n, Op op) override {
    check_gloo(
        [&] {
          gloo::AllreduceOptions opts(ctx_);
          opts.setOutput(values, n);
          opts.setReduceFunction(gloo_op<double>(op));
          gloo::allreduce(opts);
        },
        "gloo::allreduce (timings)", rank_);
  }
  void allgather(const void* in, void* out, size_t bytes) override {
    check_gloo(
        [&] {
          gloo::AllgatherOptions opts(ctx_);
          opts.setInput(static_cast<uint8_t*>(const_cast<void*>(in)), bytes);
          opts.setOutput(static_cast<uint8_t*>(out), bytes * static_cast<size_t>(nranks_));
          gloo::allgather(opts);
        },
        "gloo::allgather (rank info)", rank_);
  }
  // The op travels as Op in OpArgs; Gloo needs no handle of ours.
  chorusRedOp_t acquire_op(Op, chorusDataType_t) override { return chorusSum; }
  const std::shared_ptr<gloo::Context>& context() const { return ctx_; }

 private:
  int rank_ = 0;
  int nranks_ = 1;
  std::filesystem::path dir_;
  std::shared_ptr<gloo::Context> ctx_;
};

class GlooAllReduce final : public AllReduceShape {
 public:
  explicit GlooAllReduce(const GlooBackend* backend) : backend_(backend) {}
  void run(const OpArgs& a) const override {
    if (a.count == 0) return;  // nothing to reduce (Gloo refuses zero elements)
    switch (a.dtype) {
      case chorusFloat64: return run_typed<double>(a);
      case chorusInt32: return run_typed<int32_t>(a);
      default: return run_typed<float>(a);
    }
  }

 private:
  template <typename T>
  void run_typed(const OpArgs& a) const {
    check_gloo(
        [&] {
          gloo::AllreduceOptions opts(backend_->context());
          opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
          if (!a.inplace) opts.setInput(static_cast<T*>(const_cast<void*>(a.send)), a.count);
          opts.setOutput(static_cast<T*>(a.recv), a.count);
          opts.setReduceFunction(gloo_op<T>(a.op));
          gloo::allreduce(opts);
        },
        "gloo::allreduce", a.rank);
  }
  const GlooBackend* backend_;
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) {
  using namespace chorus::perf;
  const char* r = std::getenv("CHORUS_RANK");
  const bool verbose = r == nullptr || std::string(r) == "0";
  const ToolInfo tool{"gloo_allreduce_perf",
                      "beifnwcdoaJh",
                      {chorusInt32, chorusFloat32, chorusFloat64},
                      {Op::Sum, Op::Prod, Op::Max, Op::Min}};
  Options opts;
  int rc = parse_options(argc, argv, tool, &opts, verbose);
  if (rc >= 0) return rc;
  try {
    GlooBackend backend;
    return run_sweep(opts, tool, GlooAllReduce{&backend}, backend);
  } catch (const PerfError& e) {
    std::fprintf(stderr, "gloo_allreduce_perf: %s\n", e.what());
    return kExitFailed;
  }
}

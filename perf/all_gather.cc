// all_gather_perf: the size is the gathered output; each rank contributes size / nranks bytes.
#include "common.h"

namespace chorus::perf {
namespace {

class AllGather final : public Collective {
 public:
  bool compressible() const override { return true; }
  const char* name() const override { return "all_gather"; }
  Layout layout(size_t bytes, size_t ts, int nranks) const override { return gathered_layout(bytes, ts, nranks); }
  // In place, each rank's input already sits in its own block of the output.
  size_t inplace_send_offset(const Layout& l, int rank) const override { return static_cast<size_t>(rank) * l.count; }
  double bus_factor(int n) const override { return static_cast<double>(n - 1) / n; }
  Expect expect(const Layout& l, int, int, int, size_t i) const override {
    return {Expect::Copy, static_cast<int>(i / l.count), i % l.count};
  }
  void run(const OpArgs& a) const override {
    check_chorus(chorusAllGatherEx(a.send, a.recv, a.count, a.dtype, a.options, a.comm, nullptr), "chorusAllGather",
                 a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::AllGather{}); }

// reduce_scatter_perf: the size is each rank's input; rank r ends with block r of the reduction.
#include "common.h"

namespace chorus::perf {
namespace {

class ReduceScatter final : public Collective {
 public:
  bool compressible() const override { return true; }
  const char* name() const override { return "reduce_scatter"; }
  bool reduces() const override { return true; }
  Layout layout(size_t bytes, size_t ts, int nranks) const override { return scattered_layout(bytes, ts, nranks); }
  // In place, each rank's result lands on its own block of the input.
  size_t inplace_recv_offset(const Layout& l, int rank) const override { return static_cast<size_t>(rank) * l.count; }
  double bus_factor(int n) const override { return static_cast<double>(n - 1) / n; }
  Expect expect(const Layout& l, int rank, int, int, size_t i) const override {
    return {Expect::Reduce, 0, static_cast<size_t>(rank) * l.count + i};
  }
  void run(const OpArgs& a) const override {
    check_chorus(chorusReduceScatterEx(a.send, a.recv, a.count, a.dtype, a.redop, a.options, a.comm, nullptr),
                 "chorusReduceScatter", a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::ReduceScatter{}); }

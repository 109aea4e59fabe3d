// reduce_perf: the root ends with the reduction of every rank's `count` elements; other outputs are undefined.
#include "common.h"

namespace chorus::perf {
namespace {

class Reduce final : public Collective {
 public:
  const char* name() const override { return "reduce"; }
  bool reduces() const override { return true; }
  bool rooted() const override { return true; }
  Layout layout(size_t bytes, size_t ts, int) const override {
    const size_t count = bytes / ts;
    return {count, count, count, count * ts, count};
  }
  double bus_factor(int) const override { return 1.0; }
  Expect expect(const Layout&, int rank, int, int root, size_t i) const override {
    return rank == root ? Expect{Expect::Reduce, 0, i} : Expect{Expect::Skip, 0, 0};
  }
  void run(const OpArgs& a) const override {
    check_chorus(chorusReduceEx(a.send, a.recv, a.count, a.dtype, a.redop, a.root, a.options, a.comm, nullptr),
                 "chorusReduce", a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::Reduce{}); }

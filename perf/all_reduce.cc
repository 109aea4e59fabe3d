// all_reduce_perf: every rank ends with the reduction of every rank's `count` elements.
#include "common.h"

namespace chorus::perf {
namespace {

class AllReduce final : public Collective {
 public:
  const char* name() const override { return "all_reduce"; }
  bool reduces() const override { return true; }
  Layout layout(size_t bytes, size_t ts, int nranks) const override {
    const size_t count = bytes / ts;
    return {count, count, count, count * ts, count};
  }
  // A ring moves each byte 2(n-1)/n times through every rank's link.
  double bus_factor(int n) const override { return 2.0 * (n - 1) / n; }
  Expect expect(const Layout&, int, int, int, size_t i) const override { return {Expect::Reduce, 0, i}; }
  void run(const OpArgs& a) const override {
    check_chorus(chorusAllReduceEx(a.send, a.recv, a.count, a.dtype, a.redop, a.options, a.comm, nullptr),
                 "chorusAllReduce", a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::AllReduce{}); }

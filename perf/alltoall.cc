// alltoall_perf: the size is each rank's input; block j of rank r's input ends as block r of rank j's output.
#include "common.h"

namespace chorus::perf {
namespace {

class AllToAll final : public Collective {
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
  void run(const OpArgs& a) const override {
    check_chorus(chorusAllToAllEx(a.send, a.recv, a.count, a.dtype, a.options, a.comm, nullptr), "chorusAllToAll",
                 a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::AllToAll{}); }

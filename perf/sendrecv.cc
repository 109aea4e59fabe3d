// sendrecv_perf: each rank sends `count` elements to rank + 1 and receives as many from rank - 1, in one group.
#include "common.h"

namespace chorus::perf {
namespace {

class SendRecv final : public Collective {
 public:
  const char* name() const override { return "sendrecv"; }
  Layout layout(size_t bytes, size_t ts, int) const override {
    const size_t count = bytes / ts;
    return {count, count, count, count * ts, count};
  }
  double bus_factor(int) const override { return 1.0; }
  Expect expect(const Layout&, int rank, int n, int, size_t i) const override {
    return {Expect::Copy, (rank + n - 1) % n, i};
  }
  void run(const OpArgs& a) const override {
    const int next = (a.rank + 1) % a.nranks, prev = (a.rank + a.nranks - 1) % a.nranks;
    check_chorus(chorusGroupStart(), "chorusGroupStart", a.comm, a.rank);
    const chorusResult_t s = chorusSend(a.send, a.count, a.dtype, next, a.comm, nullptr);
    const chorusResult_t r = chorusRecv(a.recv, a.count, a.dtype, prev, a.comm, nullptr);
    // Close the group even after a failed call so that this thread's group state is not left open.
    const chorusResult_t e = chorusGroupEnd();
    check_chorus(s, "chorusSend", a.comm, a.rank);
    check_chorus(r, "chorusRecv", a.comm, a.rank);
    check_chorus(e, "chorusGroupEnd", a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::SendRecv{}); }

// broadcast_perf: every rank ends with the root's `count` elements.
#include "common.h"

namespace chorus::perf {
namespace {

class Broadcast final : public Collective {
 public:
  const char* name() const override { return "broadcast"; }
  bool rooted() const override { return true; }
  Layout layout(size_t bytes, size_t ts, int) const override {
    const size_t count = bytes / ts;
    return {count, count, count, count * ts, count};
  }
  double bus_factor(int) const override { return 1.0; }
  Expect expect(const Layout&, int, int, int root, size_t i) const override { return {Expect::Copy, root, i}; }
  void run(const OpArgs& a) const override {
    check_chorus(chorusBroadcastEx(a.send, a.recv, a.count, a.dtype, a.root, a.options, a.comm, nullptr),
                 "chorusBroadcast", a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::Broadcast{}); }

// all_reduce_perf: every rank ends with the reduction of every rank's `count` elements.
#include "common.h"

namespace chorus::perf {
namespace {

class AllReduce final : public AllReduceShape {
 public:
  bool compressible() const override { return true; }
  void run(const OpArgs& a) const override {
    check_chorus(chorusAllReduceEx(a.send, a.recv, a.count, a.dtype, a.redop, a.options, a.comm, nullptr),
                 "chorusAllReduce", a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::AllReduce{}); }

// alltoall_perf: chorusAllToAll over the shared sweep (AllToAllShape in common.h).
#include "common.h"

namespace chorus::perf {
namespace {

class AllToAll final : public AllToAllShape {
 public:
  void run(const OpArgs& a) const override {
    check_chorus(chorusAllToAllEx(a.send, a.recv, a.count, a.dtype, a.options, a.comm, nullptr), "chorusAllToAll",
                 a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::AllToAll{}); }

// gather_perf: chorusGather over the shared sweep (GatherShape in common.h).
#include "common.h"

namespace chorus::perf {
namespace {

class Gather final : public GatherShape {
 public:
  void run(const OpArgs& a) const override {
    check_chorus(chorusGatherEx(a.send, a.recv, a.count, a.dtype, a.root, a.options, a.comm, nullptr), "chorusGather",
                 a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::Gather{}); }

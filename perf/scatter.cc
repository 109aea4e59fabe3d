// scatter_perf: chorusScatter over the shared sweep (ScatterShape in common.h).
#include "common.h"

namespace chorus::perf {
namespace {

class Scatter final : public ScatterShape {
 public:
  void run(const OpArgs& a) const override {
    check_chorus(chorusScatterEx(a.send, a.recv, a.count, a.dtype, a.root, a.options, a.comm, nullptr), "chorusScatter",
                 a.comm, a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) { return chorus::perf::perf_main(argc, argv, chorus::perf::Scatter{}); }

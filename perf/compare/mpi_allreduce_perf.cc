// mpi_allreduce_perf: the all_reduce_perf sweep, data, checks and columns, through Open MPI's MPI_Allreduce, as the
// baseline Chorus is measured against. Launch with mpirun; in place uses MPI_IN_PLACE.
#include "compare/mpi_backend.h"

namespace chorus::perf {
namespace {

class MpiAllReduce final : public AllReduceShape {
 public:
  void run(const OpArgs& a) const override {
    check_mpi(MPI_Allreduce(a.inplace ? MPI_IN_PLACE : a.send, a.recv, mpi_count(a.count), mpi_type(a.dtype),
                            mpi_op(a.op), MPI_COMM_WORLD),
              "MPI_Allreduce", a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) {
  using namespace chorus::perf;
  const ToolInfo tool{"mpi_allreduce_perf",
                      "beifnwcdoaJh",
                      {chorusInt32, chorusFloat32, chorusFloat64},
                      {Op::Sum, Op::Prod, Op::Max, Op::Min}};
  return mpi_main(argc, argv, tool, MpiAllReduce{});
}

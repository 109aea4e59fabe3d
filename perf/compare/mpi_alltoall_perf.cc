// mpi_alltoall_perf: the alltoall_perf sweep, data, checks and columns through Open MPI's MPI_Alltoall, as the
// baseline of Chorus's all-to-all. Launch with mpirun; in place uses MPI_IN_PLACE.
#include "compare/mpi_backend.h"

namespace chorus::perf {
namespace {

class MpiAllToAll final : public AllToAllShape {
 public:
  void run(const OpArgs& a) const override {
    const int n = mpi_count(a.count);
    check_mpi(MPI_Alltoall(a.inplace ? MPI_IN_PLACE : a.send, n, mpi_type(a.dtype), a.recv, n, mpi_type(a.dtype),
                           MPI_COMM_WORLD),
              "MPI_Alltoall", a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) {
  using namespace chorus::perf;
  const ToolInfo tool{"mpi_alltoall_perf", "beifnwcdJh", {chorusInt32, chorusFloat32, chorusFloat64}, {Op::None}};
  return mpi_main(argc, argv, tool, MpiAllToAll{});
}

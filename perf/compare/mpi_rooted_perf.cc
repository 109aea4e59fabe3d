// mpi_gather_perf and mpi_scatter_perf (one source, CHORUS_MPI_SCATTER picks): the gather_perf and scatter_perf
// sweeps, data, checks and columns through Open MPI's MPI_Gather and MPI_Scatter, as the baseline of Chorus's gather
// and scatter. Launch with mpirun; in place uses MPI_IN_PLACE at the root.
#include "compare/mpi_backend.h"

namespace chorus::perf {
namespace {

class MpiGather final : public GatherShape {
 public:
  void run(const OpArgs& a) const override {
    const int n = mpi_count(a.count);
    const bool at_root = a.rank == a.root;
    check_mpi(MPI_Gather(a.inplace && at_root ? MPI_IN_PLACE : a.send, n, mpi_type(a.dtype), a.recv, n,
                         mpi_type(a.dtype), a.root, MPI_COMM_WORLD),
              "MPI_Gather", a.rank);
  }
};

class MpiScatter final : public ScatterShape {
 public:
  void run(const OpArgs& a) const override {
    const int n = mpi_count(a.count);
    const bool at_root = a.rank == a.root;
    check_mpi(MPI_Scatter(a.send, n, mpi_type(a.dtype), a.inplace && at_root ? MPI_IN_PLACE : a.recv, n,
                          mpi_type(a.dtype), a.root, MPI_COMM_WORLD),
              "MPI_Scatter", a.rank);
  }
};

}  // namespace
}  // namespace chorus::perf

int main(int argc, char** argv) {
  using namespace chorus::perf;
#ifdef CHORUS_MPI_SCATTER
  const ToolInfo tool{"mpi_scatter_perf", "beifnwcdorJh", {chorusInt32, chorusFloat32, chorusFloat64}, {Op::None}};
  return mpi_main(argc, argv, tool, MpiScatter{});
#else
  const ToolInfo tool{"mpi_gather_perf", "beifnwcdorJh", {chorusInt32, chorusFloat32, chorusFloat64}, {Op::None}};
  return mpi_main(argc, argv, tool, MpiGather{});
#endif
}

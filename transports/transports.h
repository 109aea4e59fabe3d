// Constructors of the concrete transports (one folder each under transports/).
#pragma once

#include <memory>
#include <string>

#include "transports/transport.h"

namespace chorus {

std::unique_ptr<Transport> make_local_transport();
std::unique_ptr<Transport> make_shm_transport();
// Unlinks the shm segments (/dev/shm/chorus-<pid>-<launch_id>-*) that process `pid`, started with CHORUS_LAUNCH_ID
// `launch_id`, created: for a launcher whose rank `pid` has ended. A segment is unlinked once its peer has mapped it,
// so only a rank that died (or exited without destroying its communicator) before that leaves one behind. Returns
// how many it removed. Never throws.
int remove_shm_segments_of(int pid, const std::string& launch_id);
// Unlinks the shm segments whose creator is no longer alive in this process's pid namespace, whatever launched it
// (the creator's pid and pid namespace are part of the name). Every shm transport calls it as it starts, so a job
// started by torchrun, mpirun or by hand removes what a rank of an earlier one left when it died. Returns how many
// it removed. Never throws.
int remove_shm_segments_of_dead_processes();
std::unique_ptr<Transport> make_tcp_transport(const Secret& secret);
// Built only with UCX (CHORUS_WITH_UCX) / libibverbs (CHORUS_WITH_IBVERBS); transport.cc stands in for them
// otherwise. The probes say what the transport finds on this machine (chorus-info) and set *available.
std::unique_ptr<Transport> make_ucx_transport();
std::string ucx_probe(bool* available);
std::unique_ptr<Transport> make_ibverbs_transport();
std::string ibverbs_probe(bool* available);

}  // namespace chorus

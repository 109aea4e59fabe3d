// Constructors of the concrete transports (one folder each under transports/).
#pragma once

#include <memory>

#include "transports/transport.h"

namespace chorus {

std::unique_ptr<Transport> make_local_transport();
std::unique_ptr<Transport> make_shm_transport();
std::unique_ptr<Transport> make_tcp_transport(const Secret& secret);

}  // namespace chorus

#pragma once
/// \file
/// The CUDA backend's collectives between processes (runtime/core/device_comm.h): NCCL, where
/// this build found it (STAGECRAFT_WITH_NCCL); elsewhere `unavailable` says why and the ranks
/// use MPI through host memory.

#include "runtime/core/device_comm.h"

namespace stagecraft::rt::cuda {

/// The process's one instance.
const DeviceComms& nccl_comms();

}  // namespace stagecraft::rt::cuda

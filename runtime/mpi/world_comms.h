#pragma once
/// \file
/// What world.cpp and world_transports.cpp share of `World`'s insides (MPI's types stay out of
/// world.h, so that stagerun builds the same with or without MPI).

#include <mpi.h>

#include <string>

#include "runtime/mpi/world.h"

namespace stagecraft::rt::mpi {

/// Communicators of their own, so that the transport's tags never meet the gather's.
struct World::Comms {
  MPI_Comm transport = MPI_COMM_NULL;
  MPI_Comm control = MPI_COMM_NULL;   ///< Step barriers and the gather to rank 0.
  MPI_Comm pipeline = MPI_COMM_NULL;  ///< This replica's ranks, by pipeline device.
  MPI_Comm replicas = MPI_COMM_NULL;  ///< This pipeline device's ranks, by replica.
};

/// Waits for the non-blocking collective `request` within `timeout_s` (the run's --timeout):
/// past it throws `Error(kTimeout)` saying which exchange (`what`) did not complete. A rank that
/// died ends the others through mpirun; one that stopped answering would block a blocking
/// collective for good.
void complete(MPI_Request& request, const std::string& what, double timeout_s);

}  // namespace stagecraft::rt::mpi

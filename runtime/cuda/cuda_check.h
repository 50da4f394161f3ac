#pragma once
/// \file
/// CUDA, cuBLAS and cuDNN status codes turned into the runtime's errors: every call of theirs
/// goes through one of these, so a failure is one line naming the call and the library's own
/// words ("cudaMallocAsync(4294967296 bytes): out of memory").

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#ifdef STAGECRAFT_WITH_NCCL
#include <nccl.h>
#endif

#include <string_view>

namespace stagecraft::rt {
struct KernelArgs;
}

namespace stagecraft::rt::cuda {

/// Throws `Error(kMemory)` for an allocation that failed and `Error(kInternal)` otherwise,
/// naming `what` and CUDA's message, when `status` is not cudaSuccess.
void check(cudaError_t status, std::string_view what);
void check(cublasStatus_t status, std::string_view what);
void check(cudnnStatus_t status, std::string_view what);
#ifdef STAGECRAFT_WITH_NCCL
/// NCCL's: throws `Error(kInternal)` naming `what`, NCCL's words and its last error's text
/// unless `status` is ncclSuccess or ncclInProgress (a non-blocking communicator's "queued": the
/// caller then polls ncclCommGetAsyncError).
void check(ncclResult_t status, std::string_view what);
#endif

/// Throws the error of the kernel launch just made for the node of `a`, if any (naming the op
/// and the node).
void check_launch(const KernelArgs& a);

}  // namespace stagecraft::rt::cuda

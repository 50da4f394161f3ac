#include "runtime/cuda/cuda_check.h"

#include <fmt/format.h>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cuda {

void check(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears a sticky-free error so the next call is not blamed for it
  const ErrorKind kind =
      status == cudaErrorMemoryAllocation ? ErrorKind::kMemory : ErrorKind::kInternal;
  fail(kind, "{}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status));
}

void check(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const ErrorKind kind =
      status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kMemory : ErrorKind::kInternal;
  fail(kind, "{}: {} ({})", what, cublasGetStatusString(status), cublasGetStatusName(status));
}

void check(cudnnStatus_t status, std::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  fail(ErrorKind::kInternal, "{}: {}", what, cudnnGetErrorString(status));
}

#ifdef STAGECRAFT_WITH_NCCL
void check(ncclResult_t status, std::string_view what) {
  if (status == ncclSuccess || status == ncclInProgress) return;
  const char* last = ncclGetLastError(nullptr);
  fail(ErrorKind::kInternal, "{}: {}{}", what, ncclGetErrorString(status),
       last != nullptr && *last != '\0' ? fmt::format(" ({})", last) : std::string());
}
#endif

void check_launch(const KernelArgs& a) {
  // The message is formatted only on failure: this runs after every launch.
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) check(status, fmt::format("{} '{}' kernel launch", a.op_type, a.name));
}

}  // namespace stagecraft::rt::cuda

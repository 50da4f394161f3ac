#include "runtime/cuda/cuda_check.h"

#include "runtime/format/error.h"

namespace stagecraft::rt::cuda {

void check(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears a sticky-free error so the next call is not blamed for it
  ErrorKind kind = status == cudaErrorMemoryAllocation ? ErrorKind::kIo : ErrorKind::kInternal;
  fail(kind, "{}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status));
}

void check(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  ErrorKind kind = status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kIo : ErrorKind::kInternal;
  fail(kind, "{}: {} ({})", what, cublasGetStatusString(status), cublasGetStatusName(status));
}

void check(cudnnStatus_t status, std::string_view what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  fail(ErrorKind::kInternal, "{}: {}", what, cudnnGetErrorString(status));
}

}  // namespace stagecraft::rt::cuda

#pragma once
/// \file
/// STAGECRAFT_HOST_DEVICE marks a function that both compilers build: the host compiler for the
/// CPU backend and nvcc (`__host__ __device__`) for the CUDA one. The per-element headers
/// (runtime/ops/*_element.h) use it, so each element's arithmetic is written once.

#ifdef __CUDACC__
#define STAGECRAFT_HOST_DEVICE __host__ __device__
#else
#define STAGECRAFT_HOST_DEVICE
#endif

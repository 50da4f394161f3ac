// The CUDA backend's shape_ops family (families.h): Shape, Constant, ConstantOfShape and
// Range, each value made on the host by the rules the CPU backend shares (runtime/ops/
// shape_ops.h: they are small, shapes, scalars, constants the compiler did not fold) and written
// to the device output with one copy.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/core/tensor_io.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/shape_ops.h"

namespace stagecraft::rt::cuda {
namespace {

// Writes the host tensor `value` (same bytes as output k) to output k.
void write_output(const KernelArgs& a, size_t k, const Tensor& value) {
  Tensor& out = *a.out[k];
  if (value.bytes() != out.bytes())
    fail(ErrorKind::kInternal, "{} '{}': {} bytes computed for {}", a.op_type, a.name,
         value.bytes(), out.describe());
  context(a).write(out, value.data, out.bytes());
}

void shape(const KernelArgs& a) { write_output(a, 0, ops::shape_value(a, a.input(0).shape)); }

void constant(const KernelArgs& a) { write_output(a, 0, ops::constant_value(a)); }

void constant_of_shape(const KernelArgs& a) {
  const Tensor element = ops::constant_of_shape_element(a, read_ints(context(a), a.input(0)));
  Tensor filled = Tensor::uninitialized(a.out[0]->dtype, a.out[0]->shape);
  ops::fill_with(filled, element.data);
  write_output(a, 0, filled);
}

void range(const KernelArgs& a) {
  ops::check_range_inputs(a);
  CudaContext& ctx = context(a);
  ops::by_range_type(a, [&](auto zero) {
    using T = decltype(zero);
    T scalars[3];
    for (size_t k = 0; k < 3; ++k) ctx.read(a.input(k), &scalars[k], sizeof(T));
    Tensor value = Tensor::uninitialized(a.out[0]->dtype, a.out[0]->shape);
    ops::range_into<T>(a, scalars[0], scalars[1], scalars[2], value);
    write_output(a, 0, value);
  });
}

// The CPU backend's checks decide: these compute what the CPU's kernels compute.
constexpr KernelEntry kKernels[] = {
    {"Shape", shape, same_as_cpu},
    {"Constant", constant, same_as_cpu},
    {"ConstantOfShape", constant_of_shape, same_as_cpu},
    {"Range", range, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> shape_ops_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda

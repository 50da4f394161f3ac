// The CUDA backend's unary maths family (families.h), the ops of the CPU backend's
// unary_math.cpp: Exp, Log, Reciprocal, Neg, Abs, Ceil, Floor, Sin, Cos, Sign and Round
// (natively on bfloat16 and float16 too) and their float32 gradients; elementwise_kernels.cu and
// grad_eltwise_kernels.cu compute each element as the CPU does.
#include <cstdint>

#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/grad_eltwise_common.h"

namespace stagecraft::rt::cuda {
namespace {

// The checks are the CPU's: every signature it accepts has a kernel here; each gradient writes
// every element of its outputs.
constexpr KernelEntry kKernels[] = {
    {"Exp", run_unary<UnaryOp::kExp>, same_as_cpu_16bit},
    {"Log", run_unary<UnaryOp::kLog>, same_as_cpu_16bit},
    {"Reciprocal", run_unary<UnaryOp::kReciprocal>, same_as_cpu_16bit},
    {"Neg", run_unary<UnaryOp::kNeg>, same_as_cpu_16bit},
    {"Abs", run_unary<UnaryOp::kAbs>, same_as_cpu_16bit},
    {"Ceil", run_unary<UnaryOp::kCeil>, same_as_cpu_16bit},
    {"Floor", run_unary<UnaryOp::kFloor>, same_as_cpu_16bit},
    {"Sin", run_unary<UnaryOp::kSin>, same_as_cpu_16bit},
    {"Cos", run_unary<UnaryOp::kCos>, same_as_cpu_16bit},
    {"Sign", run_unary<UnaryOp::kSign>, same_as_cpu_16bit},
    {"Round", run_unary<UnaryOp::kRound>, same_as_cpu_16bit},
    {"ExpGrad", run_unary_grad<UnaryGradOp::kExp>, same_as_cpu, true},
    {"LogGrad", run_unary_grad<UnaryGradOp::kLog>, same_as_cpu, true},
    {"ReciprocalGrad", run_unary_grad<UnaryGradOp::kReciprocal>, same_as_cpu, true},
    {"NegGrad", run_unary_grad<UnaryGradOp::kNeg>, same_as_cpu, true},
    {"AbsGrad", run_unary_grad<UnaryGradOp::kAbs>, same_as_cpu, true},
    {"CeilGrad", run_unary_grad<UnaryGradOp::kZero>, same_as_cpu, true},
    {"FloorGrad", run_unary_grad<UnaryGradOp::kZero>, same_as_cpu, true},
    {"SinGrad", run_unary_grad<UnaryGradOp::kSin>, same_as_cpu, true},
    {"CosGrad", run_unary_grad<UnaryGradOp::kCos>, same_as_cpu, true},
    {"SignGrad", run_unary_grad<UnaryGradOp::kZero>, same_as_cpu, true},
    {"RoundGrad", run_unary_grad<UnaryGradOp::kZero>, same_as_cpu, true},
};

}  // namespace

std::span<const KernelEntry> unary_math_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda

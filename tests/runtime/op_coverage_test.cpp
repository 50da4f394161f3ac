// Ops of issue 15 used the way exporters use them, in small models built with the samples'
// builder: each model imports, plans on 2 devices, and its pipelined run equals the
// unpartitioned model's (inference, microbatch by microbatch), and so does its pipelined
// training (the loss of every step). The CUDA backend accepts them as the CPU does. Kernel
// gradients are checked in tests/grad; this checks the plans.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/exec/pipeline.h"
#include "samples/builder/model_builder.h"
#include "tests/runtime/op_coverage_util.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using samples::attr_float;
using samples::attr_int;
using samples::attr_ints;
using samples::attr_string;
using samples::make_float_tensor;
using samples::make_int64_tensor;
using samples::ModelBuilder;
using testing::check_cuda_accepts;
using testing::check_plans_and_training;
using testing::check_training;
using testing::import_message;
using testing::run_against_unpartitioned;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

std::string conv3x3(ModelBuilder& b, const std::string& name, const std::string& x, int64_t in,
                    int64_t out, int64_t pad) {
  const std::string w = b.add_parameter(name + ".weight", {out, in, 3, 3}, in * 9);
  const std::string bias = b.add_parameter(name + ".bias", {out}, in * 9);
  return b.add_op("Conv", "/" + name + "/Conv", {x, w, bias},
                  {attr_ints("kernel_shape", {3, 3}), attr_ints("pads", {pad, pad, pad, pad})});
}

// The classifier head the models here end with: x -> Flatten -> Gemm with fc.weight
// [4, features] and fc.bias [4] (transB; alpha and beta written out where `scaled`, as older
// exports write them) -> y [batch,4], the model's output.
void fc_output(ModelBuilder& b, const std::string& x, int64_t features, bool scaled = false) {
  const std::string flat = b.add_op("Flatten", "/Flatten", {x}, {attr_int("axis", 1)});
  const std::string w = b.add_parameter("fc.weight", {4, features}, features);
  const std::string bias = b.add_parameter("fc.bias", {4}, features);
  std::vector<onnx::AttributeProto> attrs = {attr_int("transB", 1)};
  if (scaled) attrs.insert(attrs.begin(), {attr_float("alpha", 1.0f), attr_float("beta", 1.0f)});
  b.add_node("Gemm", "/fc/Gemm", {flat, w, bias}, {"y"}, std::move(attrs));
  b.add_output("y", kFloat, {"batch", 4});
}

// x [batch,8,h,w] -> GlobalAveragePool -> the head above -> y [batch,4].
void pooled_fc_output(ModelBuilder& b, const std::string& x, bool scaled = false) {
  fc_output(b, b.add_op("GlobalAveragePool", "/gap/GlobalAveragePool", {x}), 8, scaled);
}

// A Pad as torch.onnx writes it at opset 11+: the pads a Constant node, the mode an attribute.
std::string pad(ModelBuilder& b, const std::string& name, const std::string& x,
                const std::vector<int64_t>& pads, const std::string& mode) {
  const std::string p = b.add_constant(
      "/" + name + "/Constant", make_int64_tensor({static_cast<int64_t>(pads.size())}, pads));
  return b.add_op("Pad", "/" + name + "/Pad", {x, p}, {attr_string("mode", mode)});
}

// x [batch,3,12,12] -> Conv 3x3 (pad 1) -> Relu -> Pad of zero width + AveragePool 2x2 (torch's
// AvgPool2d with count_include_pad) -> Pad reflect 1 (ReflectionPad2d) -> Conv 3x3 -> Relu
// -> Pad edge (ReplicationPad2d, asymmetric) -> Pad constant (ZeroPad2d) -> Conv 3x3 -> Relu
// -> GlobalAveragePool -> Flatten -> Gemm -> y [batch,4].
ModelBuilder pad_net() {
  ModelBuilder b("pad_net");
  b.add_input("x", kFloat, {"batch", 3, 12, 12});
  std::string x = conv3x3(b, "conv1", "x", 3, 8, 1);
  x = b.add_op("Relu", "/relu1/Relu", {x});
  x = pad(b, "pool", x, {0, 0, 0, 0, 0, 0, 0, 0}, "constant");
  x = b.add_op("AveragePool", "/pool/AveragePool", {x},
               {attr_ints("kernel_shape", {2, 2}), attr_ints("strides", {2, 2}),
                attr_ints("pads", {0, 0, 0, 0})});
  x = pad(b, "reflect", x, {0, 0, 1, 1, 0, 0, 1, 1}, "reflect");
  x = conv3x3(b, "conv2", x, 8, 8, 0);
  x = b.add_op("Relu", "/relu2/Relu", {x});
  x = pad(b, "edge", x, {0, 0, 2, 0, 0, 0, 0, 2}, "edge");
  x = pad(b, "zero", x, {0, 0, 1, 1, 0, 0, 1, 1}, "constant");
  x = conv3x3(b, "conv3", x, 8, 8, 0);
  x = b.add_op("Relu", "/relu3/Relu", {x});
  pooled_fc_output(b, x, /*scaled=*/true);
  return b;
}

// torch's F.pad(x, (0, pad_r, 0, pad_b)) with pads computed from x's shape, as Swin pads its
// feature maps to whole windows: pad_r = (4 - W % 4) % 4 (Shape -> Gather -> Mod -> Sub -> Mod),
// the pad list made ONNX's by Concat with ConstantOfShape zeros, Reshape [-1, 2], a Slice with
// step -1 (flip), a Transpose and a Reshape [-1]. Every step folds once the dims are bound.
std::string window_pad(ModelBuilder& b, const std::string& x) {
  auto c = [&](const std::string& name, std::vector<int64_t> dims, std::vector<int64_t> v) {
    return b.add_constant("/window/" + name, make_int64_tensor(dims, v));
  };
  std::vector<std::string> amounts;
  for (int64_t axis : {3, 2}) {
    const std::string n = std::to_string(axis);
    const std::string shape = b.add_op("Shape", "/window/Shape_" + n, {x});
    const std::string dim = b.add_op("Gather", "/window/Gather_" + n,
                                     {shape, c("axis_" + n, {}, {axis})}, {attr_int("axis", 0)});
    const std::string four = c("four_" + n, {}, {4});
    std::string r = b.add_op("Mod", "/window/Mod_" + n, {dim, four}, {attr_int("fmod", 0)});
    r = b.add_op("Sub", "/window/Sub_" + n, {four, r});
    r = b.add_op("Mod", "/window/Mod2_" + n, {r, four}, {attr_int("fmod", 0)});
    amounts.push_back(
        b.add_op("Unsqueeze", "/window/Unsqueeze_" + n, {r, c("zero_" + n, {1}, {0})}));
  }
  const std::string zero = c("zero", {1}, {0});
  std::string pads = b.add_op("Concat", "/window/Concat", {zero, amounts[0], zero, amounts[1]},
                              {attr_int("axis", 0)});
  const std::string count =
      b.add_op("Gather", "/window/Gather_len",
               {b.add_op("Shape", "/window/Shape_pads", {pads}), zero}, {attr_int("axis", 0)});
  const std::string rest = b.add_op("Sub", "/window/Sub_len", {c("eight", {}, {8}), count});
  const std::string zeros = b.add_op("ConstantOfShape", "/window/ConstantOfShape", {rest},
                                     {samples::attr_tensor("value", make_int64_tensor({1}, {0}))});
  pads = b.add_op("Concat", "/window/Concat_all", {pads, zeros}, {attr_int("axis", 0)});
  pads = b.add_op("Reshape", "/window/Reshape", {pads, c("pairs", {2}, {-1, 2})});
  pads = b.add_op(
      "Slice", "/window/Slice",
      {pads, c("start", {1}, {-1}), c("end", {1}, {INT64_MIN + 1}), zero, c("step", {1}, {-1})});
  pads = b.add_op("Transpose", "/window/Transpose", {pads}, {attr_ints("perm", {1, 0})});
  pads = b.add_op("Reshape", "/window/Reshape_1", {pads, c("flat", {1}, {-1})});
  return b.add_op("Pad", "/window/Pad", {x, pads}, {attr_string("mode", "constant")});
}

// x [batch,4,10,10] -> Conv 3x3 (pad 1) -> Relu -> the window Pad above (to 12x12) -> Conv 3x3
// -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> y [batch,4].
ModelBuilder window_pad_net() {
  ModelBuilder b("window_pad_net");
  b.add_input("x", kFloat, {"batch", 4, 10, 10});
  std::string x = b.add_op("Relu", "/relu1/Relu", {conv3x3(b, "conv1", "x", 4, 8, 1)});
  x = window_pad(b, x);
  x = b.add_op("Relu", "/relu2/Relu", {conv3x3(b, "conv2", x, 8, 8, 0)});
  pooled_fc_output(b, x, /*scaled=*/true);
  return b;
}

// A CBAM-style attention block and a normalised head, the reductions as torch exports them:
// x [batch,4,8,8] -> Conv 3x3 -> Relu = f; s = Sigmoid(Conv(Concat(ReduceMean(f, 1),
// ReduceMax(f, 1)))) (torch.mean / torch.amax over channels, keepdim); f * s -> ReduceSum over
// (2, 3) with the axes a Constant input (opset 13, x.sum(dim=(2, 3))) -> Gemm -> z;
// y = z / ReduceL2(z, 1) (F.normalize without its clamp) -> y [batch,4].
ModelBuilder reduce_net() {
  ModelBuilder b("reduce_net");
  b.add_input("x", kFloat, {"batch", 4, 8, 8});
  const std::string f = b.add_op("Relu", "/relu1/Relu", {conv3x3(b, "conv1", "x", 4, 8, 1)});
  const std::string mean = b.add_op("ReduceMean", "/attn/ReduceMean", {f},
                                    {attr_ints("axes", {1}), attr_int("keepdims", 1)});
  const std::string max = b.add_op("ReduceMax", "/attn/ReduceMax", {f},
                                   {attr_ints("axes", {1}), attr_int("keepdims", 1)});
  std::string s = b.add_op("Concat", "/attn/Concat", {mean, max}, {attr_int("axis", 1)});
  s = b.add_op("Sigmoid", "/attn/Sigmoid", {conv3x3(b, "attn.conv", s, 2, 1, 1)});
  std::string x = b.add_op("Mul", "/attn/Mul", {f, s});
  const std::string axes = b.add_constant("/sum/Constant", make_int64_tensor({2}, {2, 3}));
  x = b.add_op("ReduceSum", "/sum/ReduceSum", {x, axes}, {attr_int("keepdims", 0)});
  const std::string w = b.add_parameter("fc.weight", {4, 8}, 8);
  const std::string bias = b.add_parameter("fc.bias", {4}, 8);
  x = b.add_op("Gemm", "/fc/Gemm", {x, w, bias}, {attr_int("transB", 1)});
  const std::string norm = b.add_op("ReduceL2", "/normalize/ReduceL2", {x},
                                    {attr_ints("axes", {1}), attr_int("keepdims", 1)});
  b.add_node("Div", "/normalize/Div", {x, norm}, {"y"});
  b.add_output("y", kFloat, {"batch", 4});
  return b;
}

std::string scalar(ModelBuilder& b, const std::string& name, float value) {
  return b.add_constant(name, make_float_tensor({}, {value}));
}

// The unary maths as torch writes them: x [batch,4,8,8] -> Conv 3x3 = h; a = exp(-|h|)
// (torch.exp(-h.abs()), a Laplacian kernel); s = log(exp(h) + 1) (softplus written out);
// q = floor(4 h) / 4 + ceil(h) / 8 (a quantizer: no gradient through it); r = 1 / (s + 1)
// (torch.reciprocal); Relu(a + s + q + r + h)
// -> Conv 3x3 -> GlobalAveragePool -> Flatten -> Gemm -> y [batch,4].
ModelBuilder unary_net() {
  ModelBuilder b("unary_net");
  b.add_input("x", kFloat, {"batch", 4, 8, 8});
  const std::string h = conv3x3(b, "conv1", "x", 4, 8, 1);
  std::string a = b.add_op("Abs", "/laplace/Abs", {h});
  a = b.add_op("Neg", "/laplace/Neg", {a});
  a = b.add_op("Exp", "/laplace/Exp", {a});
  std::string s = b.add_op("Exp", "/softplus/Exp", {h});
  s = b.add_op("Add", "/softplus/Add", {s, scalar(b, "/softplus/Constant", 1.0f)});
  s = b.add_op("Log", "/softplus/Log", {s});
  std::string q = b.add_op("Mul", "/quant/Mul", {h, scalar(b, "/quant/Constant", 4.0f)});
  q = b.add_op("Floor", "/quant/Floor", {q});
  q = b.add_op("Div", "/quant/Div", {q, scalar(b, "/quant/Constant_1", 4.0f)});
  std::string c = b.add_op("Ceil", "/quant/Ceil", {h});
  c = b.add_op("Div", "/quant/Div_1", {c, scalar(b, "/quant/Constant_2", 8.0f)});
  q = b.add_op("Add", "/quant/Add", {q, c});
  std::string r = b.add_op("Add", "/recip/Add", {s, scalar(b, "/recip/Constant", 1.0f)});
  r = b.add_op("Reciprocal", "/recip/Reciprocal", {r});
  std::string x = b.add_op("Add", "/sum/Add", {a, s});
  x = b.add_op("Add", "/sum/Add_1", {x, q});
  x = b.add_op("Add", "/sum/Add_3", {x, r});
  x = b.add_op("Add", "/sum/Add_2", {x, h});
  x = b.add_op("Relu", "/relu/Relu", {x});
  x = conv3x3(b, "conv2", x, 8, 8, 1);
  pooled_fc_output(b, x);
  return b;
}

// A segmentation net with a U-Net-style skip, its Resizes as torch 1.13 writes them at opset 17:
// x [batch,3,16,16] -> Conv 3x3 -> Relu = f1 -> MaxPool 2x2 -> Conv 3x3 -> Relu -> Resize
// nearest by scales [1,1,2,2] (nn.Upsample(scale_factor=2): asymmetric, floor; roi omitted)
// -> + f1 -> Conv 3x3 -> Relu = f3 -> AveragePool 4x4 -> Resize linear to f3's size (sizes =
// Concat(Slice(Shape(f3)), Constant), folded at import; F.interpolate(size=..., mode=
// 'bilinear'): pytorch_half_pixel) -> Resize linear by scales [1,1,0.5,0.5] with
// align_corners -> Resize linear by sizes back to 16x16 (half_pixel) -> Conv 1x1 -> y
// [batch,2,16,16].
ModelBuilder resize_net() {
  ModelBuilder b("resize_net");
  b.add_input("x", kFloat, {"batch", 3, 16, 16});
  const std::string f1 = b.add_op("Relu", "/relu1/Relu", {conv3x3(b, "conv1", "x", 3, 8, 1)});
  std::string x = b.add_op("MaxPool", "/pool/MaxPool", {f1},
                           {attr_ints("kernel_shape", {2, 2}), attr_ints("strides", {2, 2})});
  x = b.add_op("Relu", "/relu2/Relu", {conv3x3(b, "conv2", x, 8, 8, 1)});
  const std::string up_scales =
      b.add_constant("/up/Constant", samples::make_float_tensor({4}, {1.0f, 1.0f, 2.0f, 2.0f}));
  x = b.add_op("Resize", "/up/Resize", {x, "", up_scales},
               {attr_string("coordinate_transformation_mode", "asymmetric"),
                attr_float("cubic_coeff_a", -0.75f), attr_string("mode", "nearest"),
                attr_string("nearest_mode", "floor")});
  x = b.add_op("Add", "/skip/Add", {x, f1});
  const std::string f3 = b.add_op("Relu", "/relu3/Relu", {conv3x3(b, "conv3", x, 8, 4, 1)});
  x = b.add_op("AveragePool", "/pool2/AveragePool", {f3},
               {attr_ints("kernel_shape", {4, 4}), attr_ints("strides", {4, 4})});
  const std::string shape = b.add_op("Shape", "/head/Shape", {f3});
  const std::string starts = b.add_constant("/head/Constant", make_int64_tensor({1}, {0}));
  const std::string ends = b.add_constant("/head/Constant_1", make_int64_tensor({1}, {2}));
  const std::string batch_channels =
      b.add_op("Slice", "/head/Slice", {shape, starts, ends, starts});
  const std::string hw = b.add_constant("/head/Constant_2", make_int64_tensor({2}, {16, 16}));
  const std::string sizes =
      b.add_op("Concat", "/head/Concat", {batch_channels, hw}, {attr_int("axis", 0)});
  auto linear = [](const std::string& coordinates) {
    return std::vector<onnx::AttributeProto>{
        attr_string("coordinate_transformation_mode", coordinates),
        attr_float("cubic_coeff_a", -0.75f), attr_string("mode", "linear"),
        attr_string("nearest_mode", "floor")};
  };
  x = b.add_op("Resize", "/head/Resize", {x, "", "", sizes}, linear("pytorch_half_pixel"));
  const std::string half =
      b.add_constant("/down/Constant", samples::make_float_tensor({4}, {1.0f, 1.0f, 0.5f, 0.5f}));
  x = b.add_op("Resize", "/down/Resize", {x, "", half}, linear("align_corners"));
  const std::string shape2 = b.add_op("Shape", "/back/Shape", {x});
  const std::string batch = b.add_op("Slice", "/back/Slice", {shape2, starts, ends, starts});
  const std::string tail = b.add_constant("/back/Constant_1", make_int64_tensor({2}, {16, 16}));
  const std::string back_sizes =
      b.add_op("Concat", "/back/Concat", {batch, tail}, {attr_int("axis", 0)});
  x = b.add_op("Resize", "/back/Resize", {x, "", "", back_sizes}, linear("half_pixel"));
  const std::string w = b.add_parameter("cls.weight", {2, 4, 1, 1}, 4);
  const std::string bias = b.add_parameter("cls.bias", {2}, 4);
  b.add_node("Conv", "/cls/Conv", {x, w, bias}, {"y"}, {attr_ints("kernel_shape", {1, 1})});
  b.add_output("y", kFloat, {"batch", 2, 16, 16});
  return b;
}

// The activations as torch exports them: x [batch,4,8,8] -> Conv 3x3 -> Elu (nn.ELU) -> Conv 3x3
// -> Selu (nn.SELU) -> Conv 3x3 -> PRelu with a trainable slope [8,1,1] (nn.PReLU(8)) ->
// GlobalAveragePool -> Flatten -> Gemm -> Softplus (nn.Softplus, the default beta) -> y
// [batch,4].
ModelBuilder activation_net() {
  ModelBuilder b("activation_net");
  b.add_input("x", kFloat, {"batch", 4, 8, 8});
  std::string x = conv3x3(b, "conv1", "x", 4, 8, 1);
  x = b.add_op("Elu", "/elu/Elu", {x}, {attr_float("alpha", 1.0f)});
  x = conv3x3(b, "conv2", x, 8, 8, 1);
  x = b.add_op("Selu", "/selu/Selu", {x});
  x = conv3x3(b, "conv3", x, 8, 8, 1);
  const std::string slope = b.add_parameter_filled("prelu.weight", {8, 1, 1}, 0.25f);
  x = b.add_op("PRelu", "/prelu/PRelu", {x, slope});
  x = b.add_op("GlobalAveragePool", "/gap/GlobalAveragePool", {x});
  x = b.add_op("Flatten", "/Flatten", {x}, {attr_int("axis", 1)});
  const std::string w = b.add_parameter("fc.weight", {4, 8}, 8);
  const std::string bias = b.add_parameter("fc.bias", {4}, 8);
  x = b.add_op("Gemm", "/fc/Gemm", {x, w, bias}, {attr_int("transB", 1)});
  b.add_node("Softplus", "/softplus/Softplus", {x}, {"y"});
  b.add_output("y", kFloat, {"batch", 4});
  return b;
}

// Tile, CumSum, GatherElements and ScatterND as torch 1.13 writes them at opset 17, each
// operand that is not data a Constant (folded at import where it is shape arithmetic):
// x [batch,6,8] -> MatMul -> h; c = CumSum(h, axis 2) (torch.cumsum(h, -1)); g =
// GatherElements(c, idx, axis 2) with idx [1,6,3] expanded to the batch (torch.gather(c, 2,
// idx.expand(b, 6, 3)): the Expand folds); t = Tile(g, [1,1,2]) (g.repeat(1, 1, 2)); t +=
// a mask built by ScatterND on constants (Swin's shifted-window mask: folded at import);
// rows 1 and 4 of t set to Relu(rows 0:2) by ScatterND on the transposed t (t[:, [1, 4]] = v)
// -> Flatten -> Gemm -> y [batch,4].
ModelBuilder index_net() {
  ModelBuilder b("index_net");
  b.add_input("x", kFloat, {"batch", 6, 8});
  const std::string w1 = b.add_parameter("w1", {8, 8}, 8);
  std::string h = b.add_op("MatMul", "/proj/MatMul", {"x", w1});
  const std::string axis = b.add_constant("/cumsum/Constant", make_int64_tensor({}, {2}));
  const std::string c = b.add_op("CumSum", "/cumsum/CumSum", {h, axis});
  const std::string idx = b.add_constant(
      "/gather/Constant",
      make_int64_tensor({1, 6, 3}, {0, 7, 3, 1, 1, 2, 5, 4, 4, 6, 0, -1, 2, 2, 2, 3, 6, 1}));
  const std::string c_shape = b.add_op("Shape", "/gather/Shape", {c});
  const std::string zero = b.add_constant("/gather/Constant_1", make_int64_tensor({1}, {0}));
  const std::string one = b.add_constant("/gather/Constant_2", make_int64_tensor({1}, {1}));
  const std::string batch = b.add_op("Slice", "/gather/Slice", {c_shape, zero, one, zero});
  const std::string tail = b.add_constant("/gather/Constant_3", make_int64_tensor({2}, {6, 3}));
  const std::string target =
      b.add_op("Concat", "/gather/Concat", {batch, tail}, {attr_int("axis", 0)});
  const std::string indices = b.add_op("Expand", "/gather/Expand", {idx, target});
  const std::string g =
      b.add_op("GatherElements", "/gather/GatherElements", {c, indices}, {attr_int("axis", 2)});
  const std::string repeats = b.add_constant("/tile/Constant", make_int64_tensor({3}, {1, 1, 2}));
  std::string t = b.add_op("Tile", "/tile/Tile", {g, repeats});
  const std::string mask_base = b.add_constant(
      "/mask/Constant", samples::make_float_tensor({6, 6}, std::vector<float>(36, 0.0f)));
  const std::string mask_index =
      b.add_constant("/mask/Constant_1", make_int64_tensor({2, 1}, {0, 3}));
  const std::string mask_rows = b.add_constant(
      "/mask/Constant_2", samples::make_float_tensor({2, 6}, std::vector<float>(12, -0.5f)));
  const std::string mask =
      b.add_op("ScatterND", "/mask/ScatterND", {mask_base, mask_index, mask_rows});
  t = b.add_op("Add", "/mask/Add", {t, mask});
  const std::string by_row =
      b.add_op("Transpose", "/set/Transpose", {t}, {attr_ints("perm", {1, 0, 2})});
  const std::string two = b.add_constant("/set/Constant", make_int64_tensor({1}, {2}));
  const std::string rows = b.add_op("Slice", "/set/Slice", {by_row, zero, two, zero});
  const std::string v = b.add_op("Relu", "/set/Relu", {rows});
  const std::string where = b.add_constant("/set/Constant_1", make_int64_tensor({2, 1}, {1, 4}));
  std::string x = b.add_op("ScatterND", "/set/ScatterND", {by_row, where, v});
  x = b.add_op("Transpose", "/set/Transpose_1", {x}, {attr_ints("perm", {1, 0, 2})});
  fc_output(b, x, 36);
  return b;
}

std::string int64_scalar(ModelBuilder& b, const std::string& name, int64_t value) {
  return b.add_constant(name, make_int64_tensor({}, {value}));
}

// Comparisons, logic, Min, Max and Mod on activations, as torch writes them: x [batch,4,8,8]
// -> Conv 3x3 = h; keep = (h > 0.1 | h < 0.5) & ~(h < -0.3); w = where(keep, h,
// torch.fmod(h, 0.25)); m = torch.max(torch.max(h, conv2(h)), b) with a trainable b [8,1,1]
// (Max of three, broadcasting); n = torch.clamp(h, max=0.8) as Min -> Relu(w + m + n) ->
// GlobalAveragePool -> Flatten -> Gemm -> y [batch,4].
ModelBuilder logic_net() {
  ModelBuilder b("logic_net");
  b.add_input("x", kFloat, {"batch", 4, 8, 8});
  const std::string h = conv3x3(b, "conv1", "x", 4, 8, 1);
  const std::string gt = b.add_op("Greater", "/mask/Greater", {h, scalar(b, "/mask/c0", 0.1f)});
  const std::string lt = b.add_op("Less", "/mask/Less", {h, scalar(b, "/mask/c1", 0.5f)});
  const std::string neg = b.add_op("Less", "/mask/Less_1", {h, scalar(b, "/mask/c2", -0.3f)});
  const std::string either = b.add_op("Or", "/mask/Or", {gt, lt});
  const std::string keep =
      b.add_op("And", "/mask/And", {either, b.add_op("Not", "/mask/Not", {neg})});
  const std::string rem =
      b.add_op("Mod", "/mask/Mod", {h, scalar(b, "/mask/c3", 0.25f)}, {attr_int("fmod", 1)});
  const std::string w = b.add_op("Where", "/mask/Where", {keep, h, rem});
  const std::string bound = b.add_parameter_filled("max.bound", {8, 1, 1}, 0.05f);
  const std::string m = b.add_op("Max", "/max/Max", {h, conv3x3(b, "conv2", h, 8, 8, 1), bound});
  const std::string n = b.add_op("Min", "/clamp/Min", {h, scalar(b, "/clamp/c", 0.8f)});
  std::string x = b.add_op("Add", "/sum/Add", {w, m});
  x = b.add_op("Relu", "/relu/Relu", {b.add_op("Add", "/sum/Add_1", {x, n})});
  pooled_fc_output(b, x);
  return b;
}

// A shifted-window attention mask as Swin's export computes it, all int64 and bool constants:
// idx = arange(8); r = idx % 4; keep = ~((r < 2) | (idx > 5)) & (idx < 7); top =
// max(min(idx, 3), r, 1); mask = where(keep | top == 3, 0, -100) -> added to the scores of
// x [batch,8,8] @ Wq, softmax, @ x -> Flatten -> Gemm -> y [batch,4]. Folding leaves none of
// the mask's ops.
ModelBuilder window_mask_net() {
  ModelBuilder b("window_mask_net");
  b.add_input("x", kFloat, {"batch", 8, 8});
  const std::string idx =
      b.add_op("Range", "/mask/Range",
               {int64_scalar(b, "/mask/start", 0), int64_scalar(b, "/mask/limit", 8),
                int64_scalar(b, "/mask/delta", 1)});
  const std::string r = b.add_op("Mod", "/mask/Mod", {idx, int64_scalar(b, "/mask/four", 4)});
  const std::string lo = b.add_op("Less", "/mask/Less", {r, int64_scalar(b, "/mask/two", 2)});
  const std::string hi =
      b.add_op("Greater", "/mask/Greater", {idx, int64_scalar(b, "/mask/five", 5)});
  std::string keep = b.add_op("Not", "/mask/Not", {b.add_op("Or", "/mask/Or", {lo, hi})});
  keep =
      b.add_op("And", "/mask/And",
               {keep, b.add_op("Less", "/mask/Less_1", {idx, int64_scalar(b, "/mask/seven", 7)})});
  const std::string cap = b.add_op("Min", "/mask/Min", {idx, int64_scalar(b, "/mask/three", 3)});
  const std::string top = b.add_op("Max", "/mask/Max", {cap, r, int64_scalar(b, "/mask/one", 1)});
  const std::string eq =
      b.add_op("Equal", "/mask/Equal", {top, int64_scalar(b, "/mask/three_1", 3)});
  const std::string mask =
      b.add_op("Where", "/mask/Where",
               {b.add_op("Or", "/mask/Or_1", {keep, eq}), scalar(b, "/mask/zero", 0.0f),
                scalar(b, "/mask/minus", -100.0f)});
  const std::string wq = b.add_parameter("q.weight", {8, 8}, 8);
  std::string s = b.add_op("MatMul", "/attn/MatMul", {"x", wq});
  s = b.add_op("Add", "/attn/Add", {s, mask});
  s = b.add_op("Softmax", "/attn/Softmax", {s}, {attr_int("axis", -1)});
  std::string x = b.add_op("MatMul", "/attn/MatMul_1", {s, "x"});
  fc_output(b, x, 64);
  return b;
}

// Writes `b`'s model into `dir` as `file`; returns its path.
std::string write_model(const testing::TempDir& dir, const ModelBuilder& b,
                        const std::string& file) {
  const std::string path = dir.file(file);
  b.write(path);
  return path;
}

ImportedModel import_at_batch_2(const std::string& model) {
  ImportOptions options;
  options.batch = 2;
  return import_model(model, options);
}

// The CUDA backend takes each of `ops` on one float32 input as the CPU backend does.
void check_cuda_accepts_f32(std::initializer_list<const char*> ops) {
  const DType f32[] = {DType::kFloat32};
  for (const char* op : ops) check_cuda_accepts(op, f32);
}
}  // namespace

TEST_CASE("Pad as torch exports it: planned on 2 devices, run and trained as on one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, pad_net(), "pad_net.onnx");
  // The zero-width Pad before the AveragePool is dropped at import; the three others run.
  check_plans_and_training(model, "Pad", 3);
  const DType pad_inputs[] = {DType::kFloat32, DType::kInt64};
  check_cuda_accepts("Pad", pad_inputs);
}

TEST_CASE("Pad with pads computed from the shape (Swin's windows): folded, 2 devices as one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, window_pad_net(), "window_pad_net.onnx");
  // The pads fold to a constant (the Transpose among them, issue 15's swin_t); one Pad runs.
  const ImportedModel imported = import_at_batch_2(model);
  int pads = 0;
  for (const ir::Node& node : imported.graph.nodes()) {
    if (node.dead) continue;
    CHECK_MESSAGE(node.op_type != "Transpose", node.name);
    if (node.op_type == "Pad") {
      ++pads;
      CHECK(imported.graph.value(node.outputs[0]).shape == std::vector<int64_t>{2, 8, 12, 12});
    }
  }
  CHECK(pads == 1);
  CHECK(run_against_unpartitioned(model, 2, "Pad") == 1);
  check_training(model);
}

TEST_CASE("ReduceSum, ReduceMax and ReduceL2 as torch exports them: 2 devices as one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, reduce_net(), "reduce_net.onnx");
  CHECK(run_against_unpartitioned(model, 1, "ReduceSum") == 1);
  CHECK(run_against_unpartitioned(model, 2, "ReduceMax") == 1);
  check_training(model);
  const DType sum_inputs[] = {DType::kFloat32, DType::kInt64};
  check_cuda_accepts("ReduceSum", sum_inputs);
  check_cuda_accepts_f32({"ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"});
}

TEST_CASE("Exp, Log, Neg, Abs, Ceil, Floor and Reciprocal as torch writes them: 2 devices as one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, unary_net(), "unary_net.onnx");
  CHECK(run_against_unpartitioned(model, 1, "Exp") == 2);
  CHECK(run_against_unpartitioned(model, 2, "Floor") == 1);
  check_training(model);
  check_cuda_accepts_f32({"Exp", "Log", "Neg", "Abs", "Ceil", "Floor", "Reciprocal"});
}

TEST_CASE("Resize as torch exports it (nearest, bilinear): 2 devices as one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, resize_net(), "resize_net.onnx");
  check_plans_and_training(model, "Resize", 4);
  const DType by_scales[] = {DType::kFloat32, DType::kUndefined, DType::kFloat32};
  check_cuda_accepts("Resize", by_scales);
  const DType by_sizes[] = {DType::kFloat32, DType::kUndefined, DType::kUndefined, DType::kInt64};
  check_cuda_accepts("Resize", by_sizes);
}

// A Resize the backends do not run is refused at import, naming the node and the value.
TEST_CASE("Resize refusals at import: tf_crop_and_resize, data-dependent sizes") {
  testing::TempDir dir;
  // `how`: "scales" (a constant), "input" (sizes a graph input) or "cast" (sizes computed from
  // a graph input's values).
  auto refusal = [&](const std::string& mode, const std::string& coordinates,
                     const std::string& how) {
    ModelBuilder b("resize_refused");
    b.add_input("x", kFloat, {1, 2, 4, 4});
    std::string out;
    const std::vector<onnx::AttributeProto> attrs = {
        attr_string("mode", mode), attr_string("coordinate_transformation_mode", coordinates)};
    if (how == "scales") {
      const std::string scales =
          b.add_constant("/up/Constant", samples::make_float_tensor({4}, {1, 1, 2, 2}));
      out = b.add_op("Resize", "/up/Resize", {"x", "", scales}, attrs);
    } else if (how == "input") {
      b.add_input("size", onnx::TensorProto::INT64, {4});
      out = b.add_op("Resize", "/up/Resize", {"x", "", "", "size"}, attrs);
    } else {
      b.add_input("size", kFloat, {4});
      const std::string sizes =
          b.add_op("Cast", "/size/Cast", {"size"}, {attr_int("to", onnx::TensorProto::INT64)});
      out = b.add_op("Resize", "/up/Resize", {"x", "", "", sizes}, attrs);
    }
    return import_message(b, out, {1, 2, 8, 8}, dir.file(mode + coordinates + how + ".onnx"));
  };
  CHECK(refusal("nearest", "asymmetric", "scales") == "imported");
  CHECK(refusal("cubic", "pytorch_half_pixel", "scales") == "imported");  // torch's bicubic
  const std::string crop = refusal("linear", "tf_crop_and_resize", "scales");
  CHECK(crop.find("node '/up/Resize': Resize coordinate_transformation_mode "
                  "'tf_crop_and_resize' is not supported") != std::string::npos);
  const std::string input = refusal("nearest", "asymmetric", "input");
  CHECK(input.find("node '/up/Resize': Resize's sizes ('size') are a graph input, known only at "
                   "run time, so its output size is data-dependent") != std::string::npos);
  const std::string cast = refusal("linear", "half_pixel", "cast");
  CHECK(cast.find("node '/up/Resize': Resize's sizes ('/size/Cast_output_0') are computed by node "
                  "'/size/Cast' (Cast) at run time") != std::string::npos);
}

TEST_CASE(
    "Elu, Selu, PRelu (a trained slope) and Softplus as torch exports them: 2 devices as one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, activation_net(), "activation_net.onnx");
  CHECK(run_against_unpartitioned(model, 1, "PRelu") == 1);
  CHECK(run_against_unpartitioned(model, 2, "Selu") == 1);
  check_training(model);
  check_cuda_accepts_f32({"Elu", "Selu", "Softplus"});
  const DType prelu_inputs[] = {DType::kFloat32, DType::kFloat32};
  check_cuda_accepts("PRelu", prelu_inputs);
}

TEST_CASE("Tile, CumSum, GatherElements and ScatterND as torch exports them: 2 devices as one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, index_net(), "index_net.onnx");
  // The mask's ScatterND on constants is folded at import; the one on activations runs.
  CHECK(run_against_unpartitioned(model, 1, "ScatterND") == 1);
  CHECK(run_against_unpartitioned(model, 2, "GatherElements") == 1);
  check_training(model);
  const DType tile_inputs[] = {DType::kFloat32, DType::kInt64};
  check_cuda_accepts("Tile", tile_inputs);
  check_cuda_accepts("CumSum", tile_inputs);
  check_cuda_accepts("GatherElements", tile_inputs);
  const DType scatter_inputs[] = {DType::kFloat32, DType::kInt64, DType::kFloat32};
  check_cuda_accepts("ScatterND", scatter_inputs);
}

// A constant index, axis or repeat the kernels would refuse is refused at import, naming the
// node and the numbers (the kernels' own rules run on the constants).
TEST_CASE("Tile, CumSum, GatherElements and ScatterND refusals at import") {
  testing::TempDir dir;
  auto import_error = [&](const std::string& op, const onnx::TensorProto& operand,
                          std::vector<onnx::AttributeProto> attrs) {
    ModelBuilder b("indexing_refused");
    b.add_input("x", kFloat, {2, 3});
    const std::string c = b.add_constant("/op/Constant", operand);
    std::vector<std::string> inputs = {"x", c};
    if (op == "ScatterND") {
      b.add_input("u", kFloat, {1, 3});
      inputs.push_back("u");
    }
    const std::string out = b.add_op(op, "/op/" + op, inputs, std::move(attrs));
    return import_message(b, out, {2, 3}, dir.file(op + ".onnx"));
  };
  const std::string gather = import_error(
      "GatherElements", make_int64_tensor({2, 3}, {0, 1, 2, 2, 3, 0}), {attr_int("axis", 1)});
  CHECK(gather.find("GatherElements '/op/GatherElements': index 3 is out of range for axis 1 of "
                    "size 3") != std::string::npos);
  const std::string axis = import_error(
      "GatherElements", make_int64_tensor({2, 3}, {0, 1, 2, 2, 1, 0}), {attr_int("axis", 2)});
  CHECK(axis.find("axis 2 is out of range") != std::string::npos);
  const std::string cumsum = import_error("CumSum", make_int64_tensor({}, {-3}), {});
  CHECK(cumsum.find("CumSum '/op/CumSum': axis -3 is out of range for rank 2") !=
        std::string::npos);
  const std::string scatter = import_error("ScatterND", make_int64_tensor({1, 1}, {2}), {});
  CHECK(scatter.find("ScatterND '/op/ScatterND': index 2 (update 0, element 0) is out of range "
                     "for dim 0 of size 2") != std::string::npos);
  CHECK(import_error("ScatterND", make_int64_tensor({1, 1}, {-2}), {}) == "imported");
  CHECK(import_error("CumSum", make_int64_tensor({}, {-2}), {}) == "imported");
}

TEST_CASE(
    "Greater, Less, Not, And, Or, Min, Max (a trained bound) and Mod on activations: 2 devices as "
    "one") {
  testing::TempDir dir;
  const std::string model = write_model(dir, logic_net(), "logic_net.onnx");
  CHECK(run_against_unpartitioned(model, 1, "Max") == 1);
  CHECK(run_against_unpartitioned(model, 2, "Mod") == 1);
  check_training(model);
  const DType f32[] = {DType::kFloat32}, f32_pair[] = {DType::kFloat32, DType::kFloat32},
              f32_triple[] = {DType::kFloat32, DType::kFloat32, DType::kFloat32};
  check_cuda_accepts("Max", f32_triple);
  check_cuda_accepts("Min", f32_pair);
  check_cuda_accepts("Min", f32);
  const Backend* cuda = cuda_backend();
  if (cuda == nullptr) return;
  const DType bools[] = {DType::kBool, DType::kBool}, one_bool[] = {DType::kBool};
  const Attrs none;
  for (const char* op : {"Greater", "Less", "GreaterOrEqual", "LessOrEqual"})
    CHECK(cuda->check({op, f32_pair, one_bool, none}).empty());
  for (const char* op : {"And", "Or"}) CHECK(cuda->check({op, bools, one_bool, none}).empty());
  CHECK(cuda->check({"Not", one_bool, one_bool, none}).empty());
}

TEST_CASE("a Swin-style window mask (Range, Mod, comparisons, logic, Min, Max) folds away") {
  testing::TempDir dir;
  const std::string model = write_model(dir, window_mask_net(), "window_mask_net.onnx");
  const ImportedModel imported = import_at_batch_2(model);
  for (ir::NodeId id : imported.graph.topological_order()) {
    const std::string& op = imported.graph.node(id).op_type;
    CAPTURE(op);
    CHECK((op == "MatMul" || op == "Add" || op == "Softmax" || op == "Flatten" || op == "Gemm"));
  }
  CHECK(run_against_unpartitioned(model, 2, "Softmax") == 1);
  check_training(model);
}

}  // namespace stagecraft::rt

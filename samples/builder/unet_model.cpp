// The U-Net sample: an encoder-decoder whose decoder up-samples with ConvTranspose and
// concatenates the encoder's features (skip connections), named as torch.onnx exports one.
#include <stdexcept>
#include <string>

#include "samples/builder/sample_models.h"

namespace stagecraft::samples {
namespace {

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

/// A PyTorch Conv2d(in, out, kernel, stride, padding=kernel / 2) with bias.
std::string conv(ModelBuilder& b, const std::string& module, const std::string& x, int64_t in,
                 int64_t out, int64_t kernel, int64_t stride) {
  const int64_t fan_in = in * kernel * kernel, pad = kernel / 2;
  const std::string w = b.add_parameter(module + ".weight", {out, in, kernel, kernel}, fan_in);
  const std::string bias = b.add_parameter(module + ".bias", {out}, fan_in);
  return b.add_op("Conv", "/" + module + "/Conv", {x, w, bias},
                  {attr_ints("dilations", {1, 1}), attr_int("group", 1),
                   attr_ints("kernel_shape", {kernel, kernel}),
                   attr_ints("pads", {pad, pad, pad, pad}), attr_ints("strides", {stride, stride})});
}

/// A PyTorch ConvTranspose2d(in, out, kernel, stride=2, padding, output_padding) with bias; W is
/// [in, out, kernel, kernel] and PyTorch's fan-in is out * kernel * kernel.
std::string up(ModelBuilder& b, const std::string& module, const std::string& x, int64_t in,
               int64_t out, int64_t kernel, int64_t pad, int64_t output_padding) {
  const int64_t fan_in = out * kernel * kernel;
  const std::string w = b.add_parameter(module + ".weight", {in, out, kernel, kernel}, fan_in);
  const std::string bias = b.add_parameter(module + ".bias", {out}, fan_in);
  return b.add_op("ConvTranspose", "/" + module + "/ConvTranspose", {x, w, bias},
                  {attr_ints("dilations", {1, 1}), attr_int("group", 1),
                   attr_ints("kernel_shape", {kernel, kernel}),
                   attr_ints("output_padding", {output_padding, output_padding}),
                   attr_ints("pads", {pad, pad, pad, pad}), attr_ints("strides", {2, 2})});
}

std::string relu(ModelBuilder& b, const std::string& module, const std::string& x) {
  return b.add_op("Relu", "/" + module + "/Relu", {x});
}

/// nn.InstanceNorm2d(channels, affine=True) when `on`, else `x` itself.
std::string instance_norm(ModelBuilder& b, bool on, const std::string& module,
                          const std::string& x, int64_t channels) {
  if (!on) return x;
  const std::string scale = b.add_parameter_filled(module + ".norm.weight", {channels}, 1.0f);
  const std::string shift = b.add_parameter_filled(module + ".norm.bias", {channels}, 0.0f);
  return b.add_op("InstanceNormalization", "/" + module + "/norm/InstanceNormalization",
                  {x, scale, shift}, {attr_float("epsilon", 1e-5f)});
}

/// nn.GroupNorm(groups, channels) as torch 1.13 exports it at opset 17 (UNetOptions::group_norm).
std::string group_norm(ModelBuilder& b, int64_t groups, const std::string& module,
                       const std::string& x, int64_t channels) {
  const std::string p = "/" + module + "/norm/";
  std::string y =
      b.add_op("Reshape", p + "Reshape",
               {x, b.add_constant(p + "Constant", make_int64_tensor({3}, {0, groups, -1}))});
  const std::string ones = b.add_constant(
      p + "Constant_1", make_float_tensor({groups}, std::vector<float>(groups, 1.0f)));
  const std::string zeros = b.add_constant(
      p + "Constant_2", make_float_tensor({groups}, std::vector<float>(groups, 0.0f)));
  y = b.add_op("InstanceNormalization", p + "InstanceNormalization", {y, ones, zeros},
               {attr_float("epsilon", 1e-5f)});
  y = b.add_op("Reshape", p + "Reshape_1", {y, b.add_op("Shape", p + "Shape", {x})});
  auto per_channel = [&](const std::string& name, float value, const std::string& node) {
    const std::string v = b.add_parameter_filled(module + ".norm." + name, {channels}, value);
    return b.add_op("Unsqueeze", p + node,
                    {v, b.add_constant(p + node + "/axes", make_int64_tensor({2}, {1, 2}))});
  };
  y = b.add_op("Mul", p + "Mul", {y, per_channel("weight", 1.0f, "Unsqueeze")});
  return b.add_op("Add", p + "Add", {y, per_channel("bias", 0.0f, "Unsqueeze_1")});
}

}  // namespace

ModelBuilder build_unet(const UNetOptions& options, const CommonOptions& common) {
  if (common.batch < 0) throw std::invalid_argument("batch must be positive (or 0 for symbolic)");
  if (options.in_channels < 1 || options.width < 1 || options.classes < 1)
    throw std::invalid_argument("in_channels, width and classes must be positive");
  if (options.image_size < 4 || options.image_size % 4 != 0)
    throw std::invalid_argument("image_size must be a positive multiple of 4, got " +
                                std::to_string(options.image_size));
  const int64_t c = options.width, s = options.image_size;
  const Dim batch = common.batch == 0 ? Dim("batch") : Dim(common.batch);
  ModelBuilder b("unet", common.seed);
  b.add_input("x", kFloat, {batch, options.in_channels, s, s});
  const bool norm = options.instance_norm;
  const int64_t groups = options.group_norm;
  if (groups < 0 || (groups > 0 && (norm || c % groups != 0)))
    throw std::invalid_argument("group_norm must divide width " + std::to_string(c) +
                                " and exclude instance_norm, got " + std::to_string(groups));
  // Conv, then (with instance_norm or group_norm) the normalisation, then Relu.
  auto block = [&](const std::string& module, const std::string& in, int64_t from, int64_t to,
                   int64_t stride) {
    const std::string y = conv(b, module, in, from, to, 3, stride);
    if (groups > 0) return relu(b, module, group_norm(b, groups, module, y, to));
    return relu(b, module, instance_norm(b, norm, module, y, to));
  };
  const std::string e1 = block("enc1", "x", options.in_channels, c, 1);
  const std::string e2 = block("enc2", e1, c, 2 * c, 2);
  const std::string mid = block("mid", e2, 2 * c, 4 * c, 2);
  // nn.ConvTranspose2d(4c, 2c, 2, stride=2): s / 4 -> s / 2.
  std::string x = up(b, "up2", mid, 4 * c, 2 * c, 2, 0, 0);
  x = b.add_op("Concat", "/dec2/Concat", {x, e2}, {attr_int("axis", 1)});
  x = block("dec2", x, 4 * c, 2 * c, 1);
  // nn.ConvTranspose2d(2c, c, 3, stride=2, padding=1, output_padding=1): s / 2 -> s.
  x = up(b, "up1", x, 2 * c, c, 3, 1, 1);
  x = b.add_op("Concat", "/dec1/Concat", {x, e1}, {attr_int("axis", 1)});
  x = block("dec1", x, 2 * c, c, 1);
  const std::string w = b.add_parameter("head.weight", {options.classes, c, 1, 1}, c);
  const std::string bias = b.add_parameter("head.bias", {options.classes}, c);
  b.add_node("Conv", "/head/Conv", {x, w, bias}, {"logits"},
             {attr_ints("kernel_shape", {1, 1}), attr_ints("strides", {1, 1})});
  b.add_output("logits", kFloat, {batch, options.classes, s, s});
  return b;
}

}  // namespace stagecraft::samples

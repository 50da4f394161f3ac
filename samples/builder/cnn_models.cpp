// The toy perceptron, the MNIST CNN and the ResNet: the convolutional and dense samples.
#include <stdexcept>
#include <string>

#include "samples/builder/sample_models.h"

namespace stagecraft::samples {
namespace {

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

Dim batch_dim(const CommonOptions& common) {
  if (common.batch < 0) throw std::invalid_argument("batch must be positive (or 0 for symbolic)");
  return common.batch == 0 ? Dim("batch") : Dim(common.batch);
}

void require_positive(int64_t value, const char* what) {
  if (value <= 0) {
    throw std::invalid_argument(std::string(what) + " must be positive, got " +
                                std::to_string(value));
  }
}

/// A PyTorch Linear exported as Gemm(x, W[out,in], b, transB=1) named "/<module>/Gemm".
std::string linear(ModelBuilder& builder, const std::string& module, const std::string& input,
                   int64_t in_features, int64_t out_features, const std::string& output = "") {
  const std::string weight =
      builder.add_parameter(module + ".weight", {out_features, in_features}, in_features);
  const std::string bias = builder.add_parameter(module + ".bias", {out_features}, in_features);
  const std::string node = "/" + module + "/Gemm";
  return builder
      .add_node("Gemm", node, {input, weight, bias}, {output.empty() ? node + "_output_0" : output},
                {attr_float("alpha", 1.0f), attr_float("beta", 1.0f), attr_int("transB", 1)})
      .front();
}

/// A PyTorch Conv2d without bias (as in torchvision's ResNet) or with one.
std::string conv(ModelBuilder& builder, const std::string& scope, const std::string& module,
                 const std::string& input, int64_t in_channels, int64_t out_channels,
                 int64_t kernel, int64_t stride, int64_t pad, bool with_bias) {
  const int64_t fan_in = in_channels * kernel * kernel;
  std::vector<std::string> inputs = {
      input, builder.add_parameter(module + ".weight", {out_channels, in_channels, kernel, kernel},
                                   fan_in)};
  if (with_bias) inputs.push_back(builder.add_parameter(module + ".bias", {out_channels}, fan_in));
  return builder.add_op(
      "Conv", scope + "/Conv", inputs,
      {attr_ints("dilations", {1, 1}), attr_int("group", 1),
       attr_ints("kernel_shape", {kernel, kernel}), attr_ints("pads", {pad, pad, pad, pad}),
       attr_ints("strides", {stride, stride})});
}

/// A BatchNorm2d with PyTorch's initial values (scale 1, shift 0, running mean 0, running
/// variance 1); the running statistics are buffers, not parameters. In eval mode Y alone; in
/// train mode (`training`) training_mode=1 and the updated running statistics as outputs that
/// nothing reads, as torch.onnx.export(..., training=TrainingMode.TRAINING) writes it.
std::string batch_norm(ModelBuilder& builder, const std::string& scope, const std::string& module,
                       const std::string& input, int64_t channels, bool training = false) {
  const std::string scale = builder.add_parameter_filled(module + ".weight", {channels}, 1.0f);
  const std::string shift = builder.add_parameter_filled(module + ".bias", {channels}, 0.0f);
  const std::string mean = builder.add_buffer_filled(module + ".running_mean", {channels}, 0.0f);
  const std::string var = builder.add_buffer_filled(module + ".running_var", {channels}, 1.0f);
  const std::string node = scope + "/BatchNormalization";
  if (!training)
    return builder.add_op("BatchNormalization", node, {input, scale, shift, mean, var},
                          {attr_float("epsilon", 1e-5f), attr_float("momentum", 0.9f)});
  return builder.add_node("BatchNormalization", node, {input, scale, shift, mean, var},
                          {node + "_output_0", node + "_output_1", node + "_output_2"},
                          {attr_float("epsilon", 1e-5f), attr_float("momentum", 0.9f),
                           attr_int("training_mode", 1)})[0];
}

/// One torchvision BasicBlock: conv-bn-relu-conv-bn, plus the (projected) input, then relu.
std::string basic_block(ModelBuilder& builder, const std::string& stage, int64_t index,
                        const std::string& input, int64_t in_channels, int64_t out_channels,
                        int64_t stride, bool train_bn) {
  const std::string module = stage + "." + std::to_string(index);
  const std::string scope = "/" + stage + "/" + module;
  std::string x = conv(builder, scope + "/conv1", module + ".conv1", input, in_channels,
                       out_channels, 3, stride, 1, false);
  x = batch_norm(builder, scope + "/bn1", module + ".bn1", x, out_channels, train_bn);
  x = builder.add_op("Relu", scope + "/relu/Relu", {x});
  x = conv(builder, scope + "/conv2", module + ".conv2", x, out_channels, out_channels, 3, 1, 1,
           false);
  x = batch_norm(builder, scope + "/bn2", module + ".bn2", x, out_channels, train_bn);

  std::string identity = input;
  if (stride != 1 || in_channels != out_channels) {
    const std::string downsample = scope + "/downsample";
    identity = conv(builder, downsample + "/downsample.0", module + ".downsample.0", input,
                    in_channels, out_channels, 1, stride, 0, false);
    identity = batch_norm(builder, downsample + "/downsample.1", module + ".downsample.1", identity,
                          out_channels, train_bn);
  }
  x = builder.add_op("Add", scope + "/Add", {x, identity});
  return builder.add_op("Relu", scope + "/relu_1/Relu", {x});
}

/// Output size of a convolution or pooling window along one axis.
int64_t window_out(int64_t size, int64_t kernel, int64_t stride, int64_t pad) {
  return (size + 2 * pad - kernel) / stride + 1;
}

}  // namespace

ModelBuilder build_toy(const CommonOptions& common) {
  const Dim batch = batch_dim(common);
  ModelBuilder builder("toy", common.seed);
  builder.add_input("x", kFloat, {batch, 10});
  std::string x = linear(builder, "fc1", "x", 10, 10);
  x = builder.add_op("Relu", "/relu/Relu", {x});
  linear(builder, "fc2", x, 10, 5, "y");
  builder.add_output("y", kFloat, {batch, 5});
  return builder;
}

ModelBuilder build_mnist(const MnistOptions& options, const CommonOptions& common) {
  require_positive(options.channels, "mnist channels");
  require_positive(options.pool, "mnist pool");
  require_positive(options.hidden, "mnist hidden");
  require_positive(options.classes, "mnist classes");
  const Dim batch = batch_dim(common);
  ModelBuilder builder("mnist_cnn", common.seed);
  builder.add_input("x", kFloat, {batch, 1, 28, 28});

  std::string x = conv(builder, "/conv1", "conv1", "x", 1, options.channels, 3, 1, 0, true);
  x = builder.add_op("Relu", "/relu/Relu", {x});
  int64_t side = window_out(28, 3, 1, 0);
  if (options.pool > 1) {
    if (side / options.pool == 0) {
      throw std::invalid_argument("mnist pool " + std::to_string(options.pool) +
                                  " is larger than the 26x26 feature map");
    }
    x = builder.add_op(
        "MaxPool", "/pool/MaxPool", {x},
        {attr_int("ceil_mode", 0), attr_ints("dilations", {1, 1}),
         attr_ints("kernel_shape", {options.pool, options.pool}), attr_ints("pads", {0, 0, 0, 0}),
         attr_ints("strides", {options.pool, options.pool})});
    side = window_out(side, options.pool, options.pool, 0);
  }
  x = builder.add_op("Flatten", "/Flatten", {x}, {attr_int("axis", 1)});
  x = linear(builder, "fc1", x, options.channels * side * side, options.hidden);
  x = builder.add_op("Relu", "/relu_1/Relu", {x});
  linear(builder, "fc2", x, options.hidden, options.classes, "logits");
  builder.add_output("logits", kFloat, {batch, options.classes});
  return builder;
}

ModelBuilder build_resnet(const ResNetOptions& options, const CommonOptions& common) {
  if (options.widths.empty()) throw std::invalid_argument("resnet needs at least one stage width");
  for (int64_t width : options.widths) require_positive(width, "resnet width");
  require_positive(options.blocks_per_stage, "resnet blocks per stage");
  require_positive(options.in_channels, "resnet input channels");
  require_positive(options.classes, "resnet classes");
  require_positive(options.image_size, "resnet image size");
  const Dim batch = batch_dim(common);
  ModelBuilder builder("resnet", common.seed);
  builder.add_input("x", kFloat,
                    {batch, options.in_channels, options.image_size, options.image_size});
  const int64_t stem_width = options.widths.front();
  std::string x =
      conv(builder, "/conv1", "conv1", "x", options.in_channels, stem_width, 3, 1, 1, false);
  x = batch_norm(builder, "/bn1", "bn1", x, stem_width, options.train_bn);
  x = builder.add_op("Relu", "/relu/Relu", {x});
  x = builder.add_op(
      "MaxPool", "/maxpool/MaxPool", {x},
      {attr_int("ceil_mode", 0), attr_ints("dilations", {1, 1}), attr_ints("kernel_shape", {3, 3}),
       attr_ints("pads", {1, 1, 1, 1}), attr_ints("strides", {2, 2})});

  int64_t channels = stem_width;
  for (size_t stage = 0; stage < options.widths.size(); ++stage) {
    const std::string name = "layer" + std::to_string(stage + 1);
    for (int64_t block = 0; block < options.blocks_per_stage; ++block) {
      const int64_t stride = (stage > 0 && block == 0) ? 2 : 1;
      x = basic_block(builder, name, block, x, channels, options.widths[stage], stride,
                      options.train_bn);
      channels = options.widths[stage];
    }
  }
  x = builder.add_op("GlobalAveragePool", "/avgpool/GlobalAveragePool", {x});
  x = builder.add_op("Flatten", "/Flatten", {x}, {attr_int("axis", 1)});
  linear(builder, "fc", x, channels, options.classes, "logits");
  builder.add_output("logits", kFloat, {batch, options.classes});
  return builder;
}

ModelBuilder build_shared_chain(const SharedChainOptions& options, const CommonOptions& common) {
  if (options.layers < 2)
    throw std::invalid_argument("shared chain needs at least 2 layers, got " +
                                std::to_string(options.layers));
  require_positive(options.width, "shared chain width");
  const Dim batch = batch_dim(common);
  ModelBuilder builder("shared_chain", common.seed);
  builder.add_input("x", kFloat, {batch, options.width});
  const std::string shared =
      builder.add_parameter("shared.weight", {options.width, options.width}, options.width);
  std::string hidden = "x";
  for (int64_t layer = 0; layer < options.layers; ++layer) {
    const std::string scope = "/layers." + std::to_string(layer);
    const std::string module = "layers." + std::to_string(layer);
    const bool last = layer + 1 == options.layers;
    // The first and the last layer multiply by the same matrix.
    const std::string weight =
        layer == 0 || last ? shared
                           : builder.add_parameter(module + ".weight",
                                                   {options.width, options.width}, options.width);
    const std::string bias =
        builder.add_parameter(module + ".bias", {options.width}, options.width);
    hidden = builder.add_op("MatMul", scope + "/MatMul", {hidden, weight});
    if (last) {
      builder.add_node("Add", scope + "/Add", {hidden, bias}, {"y"});
    } else {
      hidden = builder.add_op("Add", scope + "/Add", {hidden, bias});
      hidden = builder.add_op("Tanh", scope + "/Tanh", {hidden});
    }
  }
  builder.add_output("y", kFloat, {batch, options.width});
  return builder;
}

}  // namespace stagecraft::samples

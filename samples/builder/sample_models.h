// Recipes for the sample models. Each returns a ModelBuilder ready to write(); tests can call
// them with small options to get a realistic graph without reading a file. The defaults are
// the models checked in under samples/models/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "samples/builder/model_builder.h"

namespace stagecraft::samples {

/// Options shared by every recipe.
struct CommonOptions {
  /// Fixed batch size, or 0 for a symbolic dimension named "batch".
  int64_t batch = 0;
  /// Seed of the pseudo-random initializer values.
  uint64_t seed = 0x5eed5a3b1e5ull;
};

/// A two-layer perceptron: x [batch,10] -> Gemm 10->10 -> Relu -> Gemm 10->5 -> y [batch,5].
ModelBuilder build_toy(const CommonOptions& common = {});

/// An MNIST-size CNN: x [batch,1,28,28] -> Conv (channels, 3x3, no padding) -> Relu
/// -> MaxPool (pool x pool, stride pool; left out when pool is 1) -> Flatten -> Gemm -> Relu
/// -> Gemm -> logits [batch,10].
struct MnistOptions {
  int64_t channels = 32;
  /// Pooling window after the convolution; 1 means no pooling layer.
  int64_t pool = 2;
  int64_t hidden = 32;
  int64_t classes = 10;
};
/// Builds the MNIST-size CNN.
ModelBuilder build_mnist(const MnistOptions& options = {}, const CommonOptions& common = {});

/// A ResNet with basic blocks (two 3x3 convolutions and a residual Add per block), named as
/// torchvision's ResNet exports: stem Conv+BatchNormalization+Relu+MaxPool, one stage per
/// width (stride 2 and a 1x1 projection where the shape changes), GlobalAveragePool, Flatten,
/// Gemm -> logits [batch,classes].
struct ResNetOptions {
  std::vector<int64_t> widths = {16, 32, 64};
  int64_t blocks_per_stage = 2;
  int64_t in_channels = 3;
  int64_t image_size = 32;
  int64_t classes = 10;
  /// BatchNormalization as PyTorch exports a model in train mode: training_mode=1 and the
  /// running statistics as outputs (stagerun updates them), not eval mode's Y alone.
  bool train_bn = false;
};
/// Builds the ResNet.
ModelBuilder build_resnet(const ResNetOptions& options = {}, const CommonOptions& common = {});

/// A GPT-2-style decoder written the way the PyTorch exporter writes one: Reshape targets
/// computed by Shape/Gather/Unsqueeze/Concat subgraphs when dims are symbolic, Constant nodes
/// for small constants, dropout as Identity, GELU as Div/Erf/Add/Mul/Mul, and a causal mask
/// (a Slice of a bool [seq,seq] buffer and Where when seq is symbolic; an Add of a float
/// [seq,seq] buffer when seq is fixed). input_ids int64 [batch,seq] -> logits [batch,seq,vocab].
struct GptOptions {
  int64_t layers = 2;
  /// Model width (d_model); must be divisible by heads.
  int64_t width = 64;
  int64_t heads = 4;
  /// Context length: the size of the position table and the causal mask, and the input's
  /// sequence length when fixed_seq is set.
  int64_t seq = 64;
  int64_t vocab = 256;
  /// Hidden width of the MLP; 0 means 4 * width.
  int64_t ffn = 0;
  /// Make the input's sequence dimension the number `seq` instead of the symbol "seq".
  bool fixed_seq = false;
  /// Tie the output head to the token embedding, as GPT-2 does: logits = hidden x wte^T
  /// (a Transpose of transformer.wte.weight), with no lm_head.weight of its own.
  bool tied = false;
  /// Mask padding keys as Hugging Face's GPT2Model does with an attention_mask: here the tokens
  /// with id 0 are padding; (1 - (input_ids != 0)) * finfo.min, [batch, 1, 1, seq], is added to
  /// every layer's scores after the causal mask.
  bool padding_mask = false;
  /// False: no causal mask (every query sees every key, as an encoder's).
  bool causal = true;
  /// A learned relative position bias, as T5 adds one: a table [2 seq - 1, heads]
  /// (`transformer.relative_attention_bias.weight`) looked up by each (query, key)'s distance
  /// (a constant [seq, seq] index), made [1, heads, seq, seq] once and added to every layer's
  /// scores. Needs fixed_seq and no causal mask (one added term per layer).
  bool position_bias = false;
};
/// Builds the GPT decoder.
ModelBuilder build_gpt(const GptOptions& options = {}, const CommonOptions& common = {});

/// A chain of `layers` dense layers x [batch,width] -> MatMul -> Add(bias) -> Tanh -> ... ->
/// y [batch,width] whose first and last layers multiply by the same matrix
/// (`shared.weight`, [width,width]), as a model an exporter deduplicated: once split, that one
/// weight is read by the first and the last stage.
struct SharedChainOptions {
  int64_t layers = 6;  ///< At least 2.
  int64_t width = 16;
};
/// Builds the chain.
ModelBuilder build_shared_chain(const SharedChainOptions& options = {},
                                const CommonOptions& common = {});

/// A U-Net-style encoder-decoder for segmentation: x [batch,in_channels,size,size] -> two
/// stride-2 Conv+Relu encoder levels -> up-sampling by ConvTranspose (kernel 2, stride 2; then
/// kernel 3, stride 2, padding 1, output_padding 1, as nn.ConvTranspose2d exports them), each
/// followed by a Concat with the encoder's features and a Conv+Relu -> a 1x1 Conv head ->
/// logits [batch,classes,size,size].
struct UNetOptions {
  int64_t in_channels = 3;
  int64_t width = 8;        ///< Channels of the first level (then 2x and 4x).
  int64_t image_size = 32;  ///< A multiple of 4.
  int64_t classes = 2;
  /// An InstanceNormalization (nn.InstanceNorm2d(affine=True): scale 1, B 0) between each
  /// encoder and decoder Conv and its Relu, as pix2pix's U-Net has.
  bool instance_norm = false;
  /// When above 0: nn.GroupNorm(group_norm, channels) there instead, as torch 1.13 exports it
  /// at opset 17 (ONNX has no GroupNormalization before opset 18): Reshape to [N, G, -1],
  /// InstanceNormalization with constant scale 1 and B 0, Reshape back to the input's Shape,
  /// then Mul and Add by the weight and bias unsqueezed to [C, 1, 1]. Divides every width.
  int64_t group_norm = 0;
};
/// Builds the U-Net.
ModelBuilder build_unet(const UNetOptions& options = {}, const CommonOptions& common = {});

/// A word-level recurrent language model as torch.onnx exports nn.Embedding ->
/// nn.LSTM / nn.GRU / nn.RNN(batch_first=True, num_layers=layers, bidirectional) -> nn.Linear:
/// input_ids int64 [batch,seq] -> logits [batch,seq,vocab], one recurrent node per layer with
/// zero initial states computed from the batch size.
struct RnnLmOptions {
  std::string cell = "LSTM";  ///< LSTM, GRU (linear_before_reset 1, as torch's) or RNN
  int64_t layers = 2;
  int64_t vocab = 64;
  int64_t embed = 32;
  int64_t hidden = 32;
  int64_t seq = 16;
  bool bidirectional = false;
};
/// Builds the language model.
ModelBuilder build_rnn_lm(const RnnLmOptions& options = {}, const CommonOptions& common = {});

}  // namespace stagecraft::samples

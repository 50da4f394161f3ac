// The GPT-style decoder, written node for node as torch.onnx.export writes a GPT-2 module
// (names follow Hugging Face's GPT2LMHeadModel: transformer.h.N.attn.c_attn, ...), including
// the shape-only subgraphs and Constant nodes that the compiler's folding pass has to remove.
#include <cmath>
#include <stdexcept>
#include <string>

#include "samples/builder/sample_models.h"

namespace stagecraft::samples {
namespace {

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;
constexpr int32_t kInt64 = onnx::TensorProto::INT64;
/// torch.finfo(torch.float32).min, the value Hugging Face writes into masked scores.
constexpr float kMaskedScore = -3.4028234663852886e38f;
/// Added above the diagonal when seq is fixed; finite so that masked scores stay finite.
constexpr float kAdditiveMask = -1e9f;

/// The fixed sizes of one decoder and the tensors every layer shares.
struct Decoder {
  int64_t width = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t ffn = 0;
  /// True when Reshape targets must be computed from the runtime shape.
  bool dynamic_shapes = false;
  bool symbolic_seq = false;
  /// Reshape targets when dynamic_shapes is false.
  std::string split_heads_shape;
  std::string merge_heads_shape;
  /// int64 [1] {0}: the axes input of every Unsqueeze.
  std::string unsqueeze_axes;
  /// int64 [1] {width}: the last piece of the merge-heads shape.
  std::string width_piece;
  /// Slice inputs for the causal mask.
  std::string mask_starts;
  std::string mask_axes;
  /// bool [seq,seq] (symbolic seq) or float [seq,seq] of 0 / kAdditiveMask (fixed seq).
  std::string causal_mask;
  /// float [batch,1,1,seq] added after the causal mask (GptOptions::padding_mask), or "".
  std::string padding_mask;
  /// float [1,heads,seq,seq] added to the scores (GptOptions::position_bias), or "".
  std::string position_bias;
  bool causal = true;  ///< GptOptions::causal.
};

std::string int64_scalar_constant(ModelBuilder& builder, const std::string& node, int64_t value) {
  return builder.add_constant(node, make_int64_tensor({}, {value}));
}

std::string float_scalar_constant(ModelBuilder& builder, const std::string& node, float value) {
  return builder.add_constant(node, make_float_tensor({}, {value}));
}

/// nn.Linear-like Conv1D of GPT-2 (weight stored [in, out]): MatMul then Add of the bias.
std::string projection(ModelBuilder& builder, const std::string& scope, const std::string& module,
                       const std::string& input, int64_t in_features, int64_t out_features) {
  const std::string weight =
      builder.add_parameter(module + ".weight", {in_features, out_features}, in_features);
  const std::string bias = builder.add_parameter(module + ".bias", {out_features}, in_features);
  const std::string product = builder.add_op("MatMul", scope + "/MatMul", {input, weight});
  return builder.add_op("Add", scope + "/Add", {product, bias});
}

std::string layer_norm(ModelBuilder& builder, const std::string& scope, const std::string& module,
                       const std::string& input, int64_t width) {
  const std::string scale = builder.add_parameter_filled(module + ".weight", {width}, 1.0f);
  const std::string shift = builder.add_parameter_filled(module + ".bias", {width}, 0.0f);
  return builder.add_op("LayerNormalization", scope + "/LayerNormalization", {input, scale, shift},
                        {attr_int("axis", -1), attr_float("epsilon", 1e-5f)});
}

/// Causal self-attention of one layer; `input` is the layer-normed hidden state.
std::string attention(ModelBuilder& builder, const Decoder& decoder, const std::string& scope,
                      const std::string& module, const std::string& input) {
  const int64_t width = decoder.width;
  const std::string qkv =
      projection(builder, scope + "/c_attn", module + ".c_attn", input, width, 3 * width);
  const std::string split_sizes =
      builder.add_constant(scope + "/Constant", make_int64_tensor({3}, {width, width, width}));
  const auto parts = builder.add_node(
      "Split", scope + "/Split", {qkv, split_sizes},
      {scope + "/Split_output_0", scope + "/Split_output_1", scope + "/Split_output_2"},
      {attr_int("axis", 2)});

  // Reshape targets [batch, seq, heads, head_dim] and [batch, seq, width], read from the
  // runtime shape as the exporter does when dims are dynamic.
  std::string split_shape = decoder.split_heads_shape;
  std::string merge_shape = decoder.merge_heads_shape;
  std::string seq_piece;
  if (decoder.dynamic_shapes) {
    const std::string shape = builder.add_op("Shape", scope + "/Shape", {input});
    const std::string zero = int64_scalar_constant(builder, scope + "/Constant_1", 0);
    const std::string one = int64_scalar_constant(builder, scope + "/Constant_2", 1);
    const std::string batch_size =
        builder.add_op("Gather", scope + "/Gather", {shape, zero}, {attr_int("axis", 0)});
    const std::string seq_len =
        builder.add_op("Gather", scope + "/Gather_1", {shape, one}, {attr_int("axis", 0)});
    const std::string batch_piece =
        builder.add_op("Unsqueeze", scope + "/Unsqueeze", {batch_size, decoder.unsqueeze_axes});
    seq_piece =
        builder.add_op("Unsqueeze", scope + "/Unsqueeze_1", {seq_len, decoder.unsqueeze_axes});
    const std::string heads_piece =
        builder.add_constant(scope + "/Constant_3", make_int64_tensor({1}, {decoder.heads}));
    const std::string head_dim_piece =
        builder.add_constant(scope + "/Constant_4", make_int64_tensor({1}, {decoder.head_dim}));
    split_shape = builder.add_op("Concat", scope + "/Concat",
                                 {batch_piece, seq_piece, heads_piece, head_dim_piece},
                                 {attr_int("axis", 0)});
    merge_shape =
        builder.add_op("Concat", scope + "/Concat_1", {batch_piece, seq_piece, decoder.width_piece},
                       {attr_int("axis", 0)});
  }

  // Q and V to [batch, heads, seq, head_dim]; K straight to [batch, heads, head_dim, seq].
  const std::vector<int64_t> permutations[] = {{0, 2, 1, 3}, {0, 2, 3, 1}, {0, 2, 1, 3}};
  std::string heads[3];
  for (int part = 0; part < 3; ++part) {
    const std::string suffix = part == 0 ? "" : "_" + std::to_string(part);
    const std::string reshaped =
        builder.add_op("Reshape", scope + "/Reshape" + suffix, {parts[part], split_shape});
    heads[part] = builder.add_op("Transpose", scope + "/Transpose" + suffix, {reshaped},
                                 {attr_ints("perm", permutations[part])});
  }
  const std::string scores = builder.add_op("MatMul", scope + "/MatMul", {heads[0], heads[1]});
  const std::string scale = float_scalar_constant(builder, scope + "/Constant_5",
                                                  std::sqrt(static_cast<float>(decoder.head_dim)));
  std::string scaled = builder.add_op("Div", scope + "/Div", {scores, scale});

  if (!decoder.causal) {
    // No causal mask.
  } else if (decoder.symbolic_seq) {
    const std::string mask_ends = builder.add_op("Concat", scope + "/Concat_2",
                                                 {seq_piece, seq_piece}, {attr_int("axis", 0)});
    const std::string mask =
        builder.add_op("Slice", scope + "/Slice",
                       {decoder.causal_mask, decoder.mask_starts, mask_ends, decoder.mask_axes});
    const std::string fill = float_scalar_constant(builder, scope + "/Constant_6", kMaskedScore);
    scaled = builder.add_op("Where", scope + "/Where", {mask, scaled, fill});
  } else {
    scaled = builder.add_op("Add", scope + "/Add", {scaled, decoder.causal_mask});
  }
  if (!decoder.padding_mask.empty())
    scaled = builder.add_op("Add", scope + "/Add_mask", {scaled, decoder.padding_mask});
  if (!decoder.position_bias.empty())
    scaled = builder.add_op("Add", scope + "/Add_bias", {scaled, decoder.position_bias});
  const std::string probs =
      builder.add_op("Softmax", scope + "/Softmax", {scaled}, {attr_int("axis", -1)});
  const std::string context = builder.add_op("MatMul", scope + "/MatMul_1", {probs, heads[2]});
  const std::string merged = builder.add_op("Transpose", scope + "/Transpose_3", {context},
                                            {attr_ints("perm", {0, 2, 1, 3})});
  const std::string flat = builder.add_op("Reshape", scope + "/Reshape_3", {merged, merge_shape});
  return projection(builder, scope + "/c_proj", module + ".c_proj", flat, width, width);
}

/// The MLP of one layer with GELU exported as x * 0.5 * (1 + erf(x / sqrt(2))).
std::string mlp(ModelBuilder& builder, const Decoder& decoder, const std::string& scope,
                const std::string& module, const std::string& input) {
  const std::string hidden =
      projection(builder, scope + "/c_fc", module + ".c_fc", input, decoder.width, decoder.ffn);
  const std::string act = scope + "/act";
  const std::string root2 = float_scalar_constant(builder, act + "/Constant", std::sqrt(2.0f));
  const std::string one = float_scalar_constant(builder, act + "/Constant_1", 1.0f);
  const std::string half = float_scalar_constant(builder, act + "/Constant_2", 0.5f);
  std::string x = builder.add_op("Div", act + "/Div", {hidden, root2});
  x = builder.add_op("Erf", act + "/Erf", {x});
  x = builder.add_op("Add", act + "/Add", {x, one});
  x = builder.add_op("Mul", act + "/Mul", {hidden, x});
  x = builder.add_op("Mul", act + "/Mul_1", {x, half});
  return projection(builder, scope + "/c_proj", module + ".c_proj", x, decoder.ffn, decoder.width);
}

void validate(const GptOptions& options) {
  const std::pair<const char*, int64_t> sizes[] = {{"layers", options.layers},
                                                   {"width", options.width},
                                                   {"heads", options.heads},
                                                   {"seq", options.seq},
                                                   {"vocab", options.vocab}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      throw std::invalid_argument(std::string("gpt ") + name + " must be positive, got " +
                                  std::to_string(value));
    }
  }
  if (options.ffn < 0) throw std::invalid_argument("gpt ffn must be positive (or 0 for 4*width)");
  if (options.width % options.heads != 0) {
    throw std::invalid_argument("gpt width " + std::to_string(options.width) +
                                " is not divisible by heads " + std::to_string(options.heads));
  }
  if (options.position_bias && (!options.fixed_seq || options.causal))
    throw std::invalid_argument("gpt position_bias needs fixed_seq and no causal mask");
}

/// Builds the position-embedding term: [seq, width], broadcast over the batch.
std::string position_embedding(ModelBuilder& builder, const GptOptions& options, bool symbolic_seq,
                               const std::string& table) {
  std::string positions;
  if (symbolic_seq) {
    const std::string shape = builder.add_op("Shape", "/transformer/Shape", {"input_ids"});
    const std::string one = int64_scalar_constant(builder, "/transformer/Constant", 1);
    const std::string seq_len =
        builder.add_op("Gather", "/transformer/Gather", {shape, one}, {attr_int("axis", 0)});
    const std::string start = int64_scalar_constant(builder, "/transformer/Constant_1", 0);
    const std::string step = int64_scalar_constant(builder, "/transformer/Constant_2", 1);
    positions = builder.add_op("Range", "/transformer/Range", {start, seq_len, step});
  } else {
    std::vector<int64_t> ids(static_cast<size_t>(options.seq));
    for (int64_t index = 0; index < options.seq; ++index) ids[static_cast<size_t>(index)] = index;
    positions = builder.add_int64_buffer("transformer.position_ids", {options.seq}, ids);
  }
  return builder.add_op("Gather", "/transformer/wpe/Gather", {table, positions},
                        {attr_int("axis", 0)});
}

/// Adds the buffers that every layer shares (mask, shape pieces) to the builder.
Decoder shared_tensors(ModelBuilder& builder, const GptOptions& options, const Dim& batch) {
  Decoder decoder;
  decoder.width = options.width;
  decoder.heads = options.heads;
  decoder.head_dim = options.width / options.heads;
  decoder.ffn = options.ffn == 0 ? 4 * options.width : options.ffn;
  decoder.symbolic_seq = !options.fixed_seq;
  decoder.causal = options.causal;
  decoder.dynamic_shapes = batch.is_symbolic() || decoder.symbolic_seq;

  const int64_t seq = options.seq;
  if (decoder.dynamic_shapes) {
    decoder.unsqueeze_axes = builder.add_int64_buffer("onnx::Unsqueeze_axes", {1}, {0});
    decoder.width_piece = builder.add_int64_buffer("onnx::Concat_width", {1}, {options.width});
  } else {
    decoder.split_heads_shape = builder.add_int64_buffer(
        "onnx::Reshape_split_heads", {4}, {batch.size(), seq, decoder.heads, decoder.head_dim});
    decoder.merge_heads_shape = builder.add_int64_buffer("onnx::Reshape_merge_heads", {3},
                                                         {batch.size(), seq, options.width});
  }
  if (!options.causal) {
    // No mask buffer.
  } else if (decoder.symbolic_seq) {
    // Hugging Face's "bias" buffer: true on and below the diagonal, sliced to the actual seq.
    std::vector<uint8_t> allowed(static_cast<size_t>(seq * seq));
    for (int64_t row = 0; row < seq; ++row) {
      for (int64_t col = 0; col <= row; ++col) allowed[static_cast<size_t>(row * seq + col)] = 1;
    }
    decoder.causal_mask = builder.add_bool_buffer("transformer.causal_mask", {seq, seq}, allowed);
    decoder.mask_starts = builder.add_int64_buffer("onnx::Slice_starts", {2}, {0, 0});
    decoder.mask_axes = builder.add_int64_buffer("onnx::Slice_axes", {2}, {0, 1});
  } else {
    std::vector<float> additive(static_cast<size_t>(seq * seq), 0.0f);
    for (int64_t row = 0; row < seq; ++row) {
      for (int64_t col = row + 1; col < seq; ++col) {
        additive[static_cast<size_t>(row * seq + col)] = kAdditiveMask;
      }
    }
    decoder.causal_mask = builder.add_float_buffer("transformer.attn_mask", {seq, seq}, additive);
  }
  return decoder;
}

}  // namespace

ModelBuilder build_gpt(const GptOptions& options, const CommonOptions& common) {
  validate(options);
  if (common.batch < 0) throw std::invalid_argument("batch must be positive (or 0 for symbolic)");
  const Dim batch = common.batch == 0 ? Dim("batch") : Dim(common.batch);
  const Dim seq = options.fixed_seq ? Dim(options.seq) : Dim("seq");

  ModelBuilder builder("gpt", common.seed);
  builder.add_input("input_ids", kInt64, {batch, seq});
  Decoder decoder = shared_tensors(builder, options, batch);
  if (options.padding_mask) {
    // GPT2Model's extended attention mask, computed once and read by every layer.
    const std::string zero = int64_scalar_constant(builder, "/transformer/Constant_pad", 0);
    const std::string padding = builder.add_op("Equal", "/transformer/Equal", {"input_ids", zero});
    const std::string keep = builder.add_op("Not", "/transformer/Not", {padding});
    const std::string keep_float =
        builder.add_op("Cast", "/transformer/Cast", {keep}, {attr_int("to", kFloat)});
    const std::string one = float_scalar_constant(builder, "/transformer/Constant_one", 1.0f);
    const std::string dropped = builder.add_op("Sub", "/transformer/Sub", {one, keep_float});
    const std::string lowest =
        float_scalar_constant(builder, "/transformer/Constant_min", kMaskedScore);
    const std::string additive = builder.add_op("Mul", "/transformer/Mul", {dropped, lowest});
    const std::string axes =
        builder.add_constant("/transformer/Constant_axes", make_int64_tensor({2}, {1, 2}));
    decoder.padding_mask =
        builder.add_op("Unsqueeze", "/transformer/Unsqueeze_mask", {additive, axes});
  }

  if (options.position_bias) {
    // T5's relative_attention_bias: the table's row for each (query, key)'s distance j - i.
    const int64_t seq = options.seq;
    std::vector<int64_t> distance(static_cast<size_t>(seq * seq));
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t j = 0; j < seq; ++j)
        distance[static_cast<size_t>(i * seq + j)] = j - i + seq - 1;
    const std::string table = builder.add_parameter("transformer.relative_attention_bias.weight",
                                                    {2 * seq - 1, options.heads}, options.heads);
    const std::string index =
        builder.add_int64_buffer("transformer.relative_position", {seq, seq}, distance);
    const std::string looked_up = builder.add_op("Gather", "/transformer/relative_attention_bias",
                                                 {table, index}, {attr_int("axis", 0)});
    const std::string per_head = builder.add_op("Transpose", "/transformer/Transpose_bias",
                                                {looked_up}, {attr_ints("perm", {2, 0, 1})});
    const std::string axes =
        builder.add_constant("/transformer/Constant_bias_axes", make_int64_tensor({1}, {0}));
    decoder.position_bias =
        builder.add_op("Unsqueeze", "/transformer/Unsqueeze_bias", {per_head, axes});
  }

  const std::string token_table = builder.add_parameter(
      "transformer.wte.weight", {options.vocab, options.width}, options.width);
  const std::string position_table =
      builder.add_parameter("transformer.wpe.weight", {options.seq, options.width}, options.width);
  const std::string tokens = builder.add_op("Gather", "/transformer/wte/Gather",
                                            {token_table, "input_ids"}, {attr_int("axis", 0)});
  const std::string positions =
      position_embedding(builder, options, decoder.symbolic_seq, position_table);
  std::string hidden = builder.add_op("Add", "/transformer/Add", {tokens, positions});
  // Dropout exports as Identity in eval mode.
  hidden = builder.add_op("Identity", "/transformer/drop/Identity", {hidden});

  for (int64_t layer = 0; layer < options.layers; ++layer) {
    const std::string module = "transformer.h." + std::to_string(layer);
    const std::string scope = "/transformer/h." + std::to_string(layer);
    std::string normed =
        layer_norm(builder, scope + "/ln_1", module + ".ln_1", hidden, options.width);
    const std::string attended =
        attention(builder, decoder, scope + "/attn", module + ".attn", normed);
    hidden = builder.add_op("Add", scope + "/Add", {hidden, attended});
    normed = layer_norm(builder, scope + "/ln_2", module + ".ln_2", hidden, options.width);
    const std::string mixed = mlp(builder, decoder, scope + "/mlp", module + ".mlp", normed);
    hidden = builder.add_op("Add", scope + "/Add_1", {hidden, mixed});
  }

  hidden = layer_norm(builder, "/transformer/ln_f", "transformer.ln_f", hidden, options.width);
  // GPT-2 ties the head to the token embedding: logits = hidden x wte^T.
  const std::string head =
      options.tied
          ? builder.add_op("Transpose", "/lm_head/Transpose", {token_table},
                           {attr_ints("perm", {1, 0})})
          : builder.add_parameter("lm_head.weight", {options.width, options.vocab}, options.width);
  builder.add_node("MatMul", "/lm_head/MatMul", {hidden, head}, {"logits"});
  builder.add_output("logits", kFloat, {batch, seq, options.vocab});
  return builder;
}

}  // namespace stagecraft::samples

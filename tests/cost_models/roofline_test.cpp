// The roofline op-time model on single nodes built in code: compute-bound products,
// memory-bound element-wise ops, views, and the split of backward into B and W.
#include "cost_models/roofline.h"

#include <doctest/doctest.h>

#include "cost_models/op_cost.h"
#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

/// A graph of hand-made values and one node at a time.
class GraphBuilder {
 public:
  /// An activation (a non-initializer value).
  ir::ValueId tensor(const std::string& name, std::vector<int64_t> shape,
                     DType dtype = DType::kFloat32) {
    ir::Value v;
    v.name = name;
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.shape_known = true;
    return graph.add_value(std::move(v));
  }

  /// A trainable weight. Its bytes are never read by the cost model, so it holds none.
  ir::ValueId weight(const std::string& name, std::vector<int64_t> shape) {
    ir::ValueId id = tensor(name, std::move(shape));
    graph.value(id).initializer = ir::WeightData::owned("");
    graph.value(id).is_weight = true;
    return id;
  }

  const ir::Node& node(const std::string& op, std::vector<ir::ValueId> inputs,
                       std::vector<ir::ValueId> outputs) {
    ir::Node n;
    n.name = op + std::to_string(graph.num_nodes());
    n.op_type = op;
    n.inputs = std::move(inputs);
    n.outputs = std::move(outputs);
    return graph.node(graph.add_node(std::move(n)));
  }

  ir::Graph graph;
};

const DeviceSpec kH100 = *device_preset("h100");

TEST_CASE("a big MatMul is compute-bound, backward is twice the forward") {
  GraphBuilder b;
  const int64_t n = 4096;
  auto x = b.tensor("x", {n, n});
  auto w = b.weight("w", {n, n});
  auto y = b.tensor("y", {n, n});
  const ir::Node& matmul = b.node("MatMul", {x, w}, {y});
  const double flops = 2.0 * n * n * n;
  REQUIRE(forward_work(b.graph, matmul).flops == flops);

  RooflineCostModel fp32(kH100, Precision::kFp32);
  OpTime t = fp32.op_time(b.graph, matmul);
  CHECK(t.forward_s ==
        doctest::Approx(kH100.launch_overhead_s + flops / (67e12 * kH100.efficiency)));
  CHECK(t.backward_input_s == doctest::Approx(t.forward_s));
  CHECK(t.backward_weight_s == doctest::Approx(t.forward_s));
  CHECK(t.backward_s == doctest::Approx(2 * t.forward_s));

  RooflineCostModel mixed(kH100, Precision::kMixed);
  OpTime m = mixed.op_time(b.graph, matmul);
  CHECK(m.forward_s ==
        doctest::Approx(kH100.launch_overhead_s + flops / (989e12 * kH100.efficiency)));
  CHECK(m.backward_s == doctest::Approx(2 * m.forward_s));
  CHECK(mixed.name() == "roofline(h100, mixed)");
}

TEST_CASE("a fused Attention's backward: Q and K's products, and the mask's pass when it learns") {
  // Q, K, V [2, 4, 256, 64] and a learned bias [1, 4, 256, 256] (T5's, after its Unsqueeze).
  GraphBuilder b;
  auto q = b.tensor("q", {2, 4, 256, 64}), k = b.tensor("k", {2, 4, 256, 64}),
       v = b.tensor("v", {2, 4, 256, 64}), bias = b.tensor("bias", {1, 4, 256, 256});
  auto o = b.tensor("o", {2, 4, 256, 64}), lse = b.tensor("lse", {2, 4, 256});
  const ir::Node& plain = b.node("Attention", {q, k, v, bias}, {o, lse});
  RooflineCostModel fp32(kH100, Precision::kFp32);
  const OpTime t = fp32.op_time(b.graph, plain);
  CHECK(t.backward_s == doctest::Approx(2 * t.forward_s));
  ir::Node learns = plain;
  learns.name = "learns";
  learns.outputs = {b.tensor("o2", {2, 4, 256, 64}), b.tensor("lse2", {2, 4, 256})};
  onnx::AttributeProto flag;
  flag.set_name("mask_gradient");
  flag.set_type(onnx::AttributeProto::INT);
  flag.set_i(1);
  learns.attributes.push_back(flag);
  const ir::Node& learning = b.graph.node(b.graph.add_node(std::move(learns)));
  const OpTime l = fp32.op_time(b.graph, learning);
  CHECK(l.forward_s == doctest::Approx(t.forward_s));
  CHECK(l.backward_input_s == doctest::Approx(3 * t.forward_s));
  CHECK(l.backward_weight_s == 0);
}

TEST_CASE("ConvTranspose counts each input element times its window, as its Conv would") {
  // U-Net's up-sampling: X [8,64,16,16], W [64,32,2,2] (C_in, C_out / group, kernel), stride 2,
  // bias: Y [8,32,32,32]. Each input element meets 32 * 2 * 2 weights.
  GraphBuilder b;
  auto x = b.tensor("x", {8, 64, 16, 16});
  auto w = b.weight("w", {64, 32, 2, 2});
  auto bias = b.weight("b", {32});
  auto y = b.tensor("y", {8, 32, 32, 32});
  const ir::Node& up = b.node("ConvTranspose", {x, w, bias}, {y});
  const double in = 8.0 * 64 * 16 * 16, out = 8.0 * 32 * 32 * 32;
  const OpWork work = forward_work(b.graph, up);
  CHECK(work.flops == 2.0 * in * 32 * 2 * 2 + out);
  // With no overlap (kernel = stride), that is the Conv mapping Y back to X's count: 2 * X
  // elements * (C_out * window).
  CHECK(work.flops - out == 2.0 * in * (32 * 4));
  CHECK(work.bytes_read == 4.0 * (in + 64 * 32 * 4 + 32));
  CHECK(work.bytes_written == 4.0 * out);
  // Grouped: W [64, 8, 3, 3] with group 4 (C_out 32): 8 * 9 weights per input element.
  GraphBuilder g;
  auto gx = g.tensor("x", {1, 64, 4, 4});
  auto gw = g.weight("w", {64, 8, 3, 3});
  auto gy = g.tensor("y", {1, 32, 9, 9});
  CHECK(forward_work(g.graph, g.node("ConvTranspose", {gx, gw}, {gy})).flops ==
        2.0 * 64 * 16 * 8 * 9);
  // A tensor op on the roofline, with input and weight gradients each as costly as the forward.
  const OpTime t = RooflineCostModel(kH100, Precision::kFp32).op_time(b.graph, up);
  CHECK(t.backward_input_s == doctest::Approx(t.forward_s));
  CHECK(t.backward_weight_s > t.forward_s);  // plus the bias gradient's pass over dY
}

TEST_CASE("LSTM counts X W^T and H R^T of every step and direction, plus the gates") {
  // A bidirectional LSTM: X [T=12, B=8, I=32], W [2, 4 * 64, 32], R [2, 4 * 64, 64], B.
  GraphBuilder b;
  auto x = b.tensor("x", {12, 8, 32});
  auto w = b.weight("w", {2, 256, 32});
  auto r = b.weight("r", {2, 256, 64});
  auto bias = b.weight("b", {2, 512});
  auto y = b.tensor("y", {12, 2, 8, 64});
  const ir::Node& lstm = b.node("LSTM", {x, w, r, bias}, {y});
  const double rows = 12.0 * 8 * 2 * 256;  // gate outputs over steps, batch and directions
  CHECK(forward_work(b.graph, lstm).flops == 2.0 * rows * (32 + 64) + 8.0 * rows);
  // A tensor op: the input and weight gradients each about as costly as the forward.
  const OpTime t = RooflineCostModel(kH100, Precision::kFp32).op_time(b.graph, lstm);
  CHECK(t.backward_input_s == doctest::Approx(t.forward_s));
  CHECK(t.backward_weight_s >= t.forward_s);
}

TEST_CASE("the first layer's backward is its weight gradient: a graph input gets none") {
  GraphBuilder b;
  auto x = b.tensor("x", {256, 1024});
  b.graph.value(x).is_graph_input = true;
  auto w = b.weight("w", {1024, 1024});
  auto y = b.tensor("y", {256, 1024});
  RooflineCostModel model(kH100, Precision::kFp32);
  OpTime t = model.op_time(b.graph, b.node("MatMul", {x, w}, {y}));
  CHECK(t.backward_input_s == 0);
  CHECK(t.backward_weight_s == doctest::Approx(t.forward_s));
  // The same product on an activation another node wrote: both parts.
  b.graph.value(x).is_graph_input = false;
  t = model.op_time(b.graph, b.graph.node(0));
  CHECK(t.backward_input_s == doctest::Approx(t.forward_s));
}

TEST_CASE("a product of two activations has only input gradients") {
  GraphBuilder b;
  auto q = b.tensor("q", {8, 12, 128, 64});
  auto k = b.tensor("k", {8, 12, 64, 128});
  auto s = b.tensor("s", {8, 12, 128, 128});
  RooflineCostModel model(kH100, Precision::kMixed);
  OpTime t = model.op_time(b.graph, b.node("MatMul", {q, k}, {s}));
  CHECK(t.backward_weight_s == 0);
  CHECK(t.backward_input_s == doctest::Approx(2 * t.forward_s));
}

TEST_CASE("Gemm with a bias: the bias gradient reads the output gradient once more") {
  GraphBuilder b;
  auto x = b.tensor("x", {256, 1024});
  auto w = b.weight("w", {1024, 1024});
  auto bias = b.weight("bias", {1024});
  auto y = b.tensor("y", {256, 1024});
  RooflineCostModel model(kH100, Precision::kFp32);
  OpTime t = model.op_time(b.graph, b.node("Gemm", {x, w, bias}, {y}));
  CHECK(t.backward_input_s == doctest::Approx(t.forward_s));
  CHECK(t.backward_weight_s ==
        doctest::Approx(t.forward_s + 256.0 * 1024 * 4 / kH100.memory_bandwidth));
}

TEST_CASE("an Add is memory-bound: a 16-bit plan runs it natively on CUDA, widened on the CPU") {
  GraphBuilder b;
  std::vector<int64_t> shape{1024, 1024, 16};
  auto x = b.tensor("x", shape), y = b.tensor("y", shape), z = b.tensor("z", shape);
  const ir::Node& add = b.node("Add", {x, y}, {z});
  const double bytes = 3.0 * 1024 * 1024 * 16 * 4;

  OpTime t = RooflineCostModel(kH100, Precision::kFp32).op_time(b.graph, add);
  CHECK(t.forward_s == doctest::Approx(kH100.launch_overhead_s + bytes / kH100.memory_bandwidth));
  // Backward reads the output gradient besides the forward's traffic; no weights.
  CHECK(t.backward_input_s ==
        doctest::Approx(kH100.launch_overhead_s + (bytes * 4 / 3) / kH100.memory_bandwidth));
  CHECK(t.backward_weight_s == 0);
  CHECK(t.backward_s > t.forward_s);
  CHECK(t.backward_s < 2 * t.forward_s);

  // CUDA adds 16-bit floats natively (half the bytes, one launch); the CPU has no 16-bit Add:
  // the float32 kernel between casts (two inputs cast in, the output cast out: 3 launches
  // more), each float32 tensor moved as 2 + 4 + 4 bytes.
  const DeviceSpec cpu = *device_preset("cpu");
  for (Precision p : {Precision::kMixed, Precision::kFp16}) {
    OpTime m = RooflineCostModel(kH100, p).op_time(b.graph, add);
    CHECK(m.forward_s ==
          doctest::Approx(kH100.launch_overhead_s + 0.5 * bytes / kH100.memory_bandwidth));
    OpTime c = RooflineCostModel(cpu, p).op_time(b.graph, add);
    CHECK(c.forward_s == doctest::Approx(4 * cpu.launch_overhead_s +
                                         std::max(2.5 * bytes / cpu.memory_bandwidth,
                                                  1024.0 * 1024 * 16 / cpu.peak_flops_fp32)));
  }
}

TEST_CASE("a 16-bit plan: products on 16-bit kernels where the backend has them, layout native") {
  GraphBuilder b;
  const int64_t n = 4096;
  auto x = b.tensor("x", {n, n}), w = b.weight("w", {n, n}), y = b.tensor("y", {n, n});
  auto yg = b.tensor("yg", {n, n}), yt = b.tensor("yt", {n, n});
  // Copies: the graph's node list grows under a reference.
  const ir::Node matmul = b.node("MatMul", {x, w}, {y});
  const ir::Node gemm = b.node("Gemm", {x, w}, {yg});
  const ir::Node transpose = b.node("Transpose", {y}, {yt});
  const DeviceSpec cpu = *device_preset("cpu");
  auto forward = [&](const DeviceSpec& d, Precision p, const ir::Node& node) {
    return RooflineCostModel(d, p).op_time(b.graph, node).forward_s;
  };
  // CUDA: MatMul in bfloat16 and float16 at the 16-bit peak; Gemm's kernel is float32, so a
  // 16-bit Gemm runs widened, no faster than float32.
  for (Precision p : {Precision::kMixed, Precision::kFp16}) {
    CAPTURE(to_string(p));
    CHECK(forward(kH100, p, matmul) < forward(kH100, Precision::kFp32, matmul) / 5);
    CHECK(forward(kH100, p, gemm) > forward(kH100, Precision::kFp32, gemm));
  }
  // The CPU: MatMul and Gemm in bfloat16 natively (oneDNN; the preset's 16-bit peak is its
  // float32 one, so a compute-bound product takes the same time), float16 widened (casts more).
  for (const ir::Node* node : {&matmul, &gemm}) {
    CAPTURE(node->op_type);
    const double fp32 = forward(cpu, Precision::kFp32, *node);
    CHECK(forward(cpu, Precision::kMixed, *node) == doctest::Approx(fp32));
    CHECK(forward(cpu, Precision::kFp16, *node) > fp32);
  }
  // Layout moves 16-bit bytes on both: half of float32's.
  const double t32 = forward(kH100, Precision::kFp32, transpose) - kH100.launch_overhead_s;
  CHECK(forward(kH100, Precision::kMixed, transpose) - kH100.launch_overhead_s ==
        doctest::Approx(t32 / 2));
}

TEST_CASE("views cost the launch alone") {
  GraphBuilder b;
  auto x = b.tensor("x", {64, 1024, 768});
  auto shape = b.tensor("shape", {4}, DType::kInt64);
  auto y = b.tensor("y", {64, 1024, 12, 64});
  RooflineCostModel model(kH100, Precision::kFp32);
  OpTime reshape = model.op_time(b.graph, b.node("Reshape", {x, shape}, {y}));
  CHECK(reshape.forward_s == kH100.launch_overhead_s);
  CHECK(reshape.backward_input_s == kH100.launch_overhead_s);
  CHECK(reshape.backward_weight_s == 0);

  // A Transpose moves its data: it reads and writes the output's bytes.
  auto t = b.tensor("t", {64, 12, 1024, 64});
  OpTime transpose = model.op_time(b.graph, b.node("Transpose", {y}, {t}));
  CHECK(transpose.forward_s == doctest::Approx(kH100.launch_overhead_s +
                                               2.0 * 64 * 1024 * 768 * 4 / kH100.memory_bandwidth));
}

TEST_CASE("an embedding Gather reads the rows it gathers and has a weight gradient only") {
  GraphBuilder b;
  auto table = b.weight("table", {50257, 768});
  auto ids = b.tensor("ids", {8, 512}, DType::kInt64);
  auto out = b.tensor("emb", {8, 512, 768});
  RooflineCostModel model(kH100, Precision::kFp32);
  OpTime t = model.op_time(b.graph, b.node("Gather", {table, ids}, {out}));
  const double out_bytes = 8.0 * 512 * 768 * 4, id_bytes = 8.0 * 512 * 8;
  CHECK(t.forward_s == doctest::Approx(kH100.launch_overhead_s +
                                       (2 * out_bytes + id_bytes) / kH100.memory_bandwidth));
  CHECK(t.backward_input_s == 0);
  CHECK(t.backward_weight_s > t.forward_s);
}

TEST_CASE("LayerNorm splits its backward into input and weight parts") {
  GraphBuilder b;
  auto x = b.tensor("x", {8, 512, 768});
  auto scale = b.weight("scale", {768});
  auto bias = b.weight("bias", {768});
  auto y = b.tensor("y", {8, 512, 768});
  RooflineCostModel model(kH100, Precision::kMixed);
  const ir::Node ln = b.node("LayerNormalization", {x, scale, bias}, {y});
  OpTime t = model.op_time(b.graph, ln);
  CHECK(t.backward_input_s > t.forward_s);
  // The W part reads the output gradient once. In a mixed plan CUDA runs LayerNormalization on
  // bfloat16 (half its float32 bytes, one launch); the CPU widens it: its float32 bytes with the
  // casts' (2.5x), and a launch per cast of its 4 floating operands.
  CHECK(t.backward_weight_s == doctest::Approx(kH100.launch_overhead_s +
                                               8.0 * 512 * 768 * 2 / kH100.memory_bandwidth));
  CHECK(t.backward_s == doctest::Approx(t.backward_input_s + t.backward_weight_s));
  const DeviceSpec cpu = *device_preset("cpu");
  OpTime c = RooflineCostModel(cpu, Precision::kMixed).op_time(b.graph, ln);
  CHECK(c.backward_weight_s ==
        doctest::Approx(5 * cpu.launch_overhead_s + 8.0 * 512 * 768 * 4 * 2.5 / cpu.memory_bandwidth));
}

TEST_CASE("ops without a floating-point result or gradient have no backward") {
  GraphBuilder b;
  auto x = b.tensor("x", {1024});
  auto y = b.tensor("y", {1024});
  auto eq = b.tensor("eq", {1024}, DType::kBool);
  RooflineCostModel model(*device_preset("cpu"), Precision::kFp32);
  OpTime equal = model.op_time(b.graph, b.node("Equal", {x, y}, {eq}));
  CHECK(equal.forward_s > 0);
  CHECK(equal.backward_s == 0);

  ir::Value constant;
  constant.name = "c";
  constant.dtype = DType::kFloat32;
  constant.shape = {1024};
  constant.shape_known = true;
  constant.initializer = ir::WeightData::owned("");
  auto c = b.graph.add_value(std::move(constant));
  auto r = b.tensor("r", {1024});
  CHECK(model.op_time(b.graph, b.node("Relu", {c}, {r})).backward_s == 0);
}

TEST_CASE("an invalid device spec is refused when the model is made") {
  DeviceSpec spec = kH100;
  spec.efficiency = 0;
  CHECK_THROWS_WITH_AS(RooflineCostModel(spec, Precision::kFp32),
                       "device 'h100': efficiency must be positive, not 0", Error);
}

}  // namespace
}  // namespace stagecraft::cost

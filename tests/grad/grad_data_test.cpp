// Finite-difference checks of the data family's gradient kernels (runtime/cpu/grad_data.cpp).
#include <doctest/doctest.h>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

GradCase make_case(const std::string& op, std::vector<Tensor> inputs, std::vector<bool> check,
                   std::function<void(onnx::NodeProto&)> attrs = {}, int opset = 17,
                   int outputs = 1) {
  GradCase c;
  c.op = op;
  c.inputs = std::move(inputs);
  c.check = std::move(check);
  c.attrs = std::move(attrs);
  c.opset = opset;
  c.outputs = outputs;
  return c;
}

// gradcheck with the int64 inputs as constants (so shape inference sees shapes that come from
// their values) and, with `no_dy`, some output gradients left out.
void gradcheck_const(GradCase c, std::vector<bool> no_dy = {}) {
  c.int64_as_constants = true;
  c.no_dy = std::move(no_dy);
  gradcheck(c);
}

}  // namespace

TEST_CASE("grad Identity") { gradcheck(make_case("Identity", {random_tensor({2, 3})}, {true})); }

TEST_CASE("grad Reshape") {
  gradcheck_const(
      make_case("Reshape", {random_tensor({2, 3, 4}), int64_tensor({2}, {4, -1})}, {true, false}));
  gradcheck_const(make_case("Reshape", {random_tensor({2, 3, 4}), int64_tensor({3}, {0, 12, 1})},
                            {true, false}));
}

TEST_CASE("grad Flatten") {
  gradcheck(make_case("Flatten", {random_tensor({2, 3, 4})}, {true}));
  gradcheck(make_case("Flatten", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_int(n, "axis", 0); }));
  gradcheck(make_case("Flatten", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_int(n, "axis", -1); }));
}

TEST_CASE("grad Squeeze") {
  gradcheck_const(
      make_case("Squeeze", {random_tensor({2, 1, 4, 1}), int64_tensor({1}, {-1})}, {true, false}));
  gradcheck(make_case("Squeeze", {random_tensor({2, 1, 4, 1})}, {true}));
  gradcheck(make_case(
      "Squeeze", {random_tensor({2, 1, 4, 1})}, {true},
      [](onnx::NodeProto& n) { set_ints(n, "axes", {1}); }, 11));
}

TEST_CASE("grad Unsqueeze") {
  gradcheck_const(
      make_case("Unsqueeze", {random_tensor({2, 4}), int64_tensor({2}, {0, -1})}, {true, false}));
  gradcheck(make_case(
      "Unsqueeze", {random_tensor({2, 4})}, {true},
      [](onnx::NodeProto& n) { set_ints(n, "axes", {1}); }, 11));
}

TEST_CASE("grad Transpose") {
  gradcheck(make_case("Transpose", {random_tensor({2, 3, 4})}, {true}));
  gradcheck(make_case("Transpose", {random_tensor({2, 3, 4, 5})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "perm", {0, 2, 3, 1});
  }));
  gradcheck(make_case("Transpose", {random_tensor({2, 3, 4, 5})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "perm", {2, 0, 3, 1});
  }));
  gradcheck(make_case("Transpose", {random_tensor({3, 1, 4})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "perm", {1, 2, 0});
  }));
}

TEST_CASE("grad Concat") {
  gradcheck(make_case("Concat", {random_tensor({3}, -1, 1, 1), random_tensor({2}, -1, 1, 2)},
                      {true, true}, [](onnx::NodeProto& n) { set_int(n, "axis", 0); }));
  auto axis = [](int64_t v) { return [v](onnx::NodeProto& n) { set_int(n, "axis", v); }; };
  gradcheck(make_case("Concat",
                      {random_tensor({2, 3, 4}, -1, 1, 1), random_tensor({2, 5, 4}, -1, 1, 2)},
                      {true, true}, axis(1)));
  gradcheck(make_case("Concat",
                      {random_tensor({2, 3}, -1, 1, 1), random_tensor({1, 3}, -1, 1, 2),
                       random_tensor({3, 3}, -1, 1, 3)},
                      {true, false, true}, axis(0)));
  gradcheck(make_case("Concat", {random_tensor({2, 3}, -1, 1, 1), random_tensor({2, 2}, -1, 1, 2)},
                      {true, true}, axis(-1)));
}

TEST_CASE("grad Split") {
  SUBCASE("equal parts") {
    gradcheck(make_case(
        "Split", {random_tensor({2, 6, 3})}, {true},
        [](onnx::NodeProto& n) { set_int(n, "axis", 1); }, 17, 3));
  }
  SUBCASE("equal parts, default axis (opset 13)") {
    gradcheck(make_case("Split", {random_tensor({4, 3})}, {true}, {}, 13, 2));
  }
  SUBCASE("split attribute (opset 11), last axis") {
    gradcheck(make_case(
        "Split", {random_tensor({2, 3, 5})}, {true},
        [](onnx::NodeProto& n) {
          set_int(n, "axis", -1);
          set_ints(n, "split", {1, 4});
        },
        11, 2));
  }
  SUBCASE("split input (opset 13)") {
    gradcheck_const(make_case("Split", {random_tensor({6, 2}), int64_tensor({3}, {1, 3, 2})},
                              {true, false}, {}, 13, 3));
  }
  SUBCASE("an omitted output gradient") {
    gradcheck_const(make_case(
                        "Split", {random_tensor({4, 3})}, {true},
                        [](onnx::NodeProto& n) {
                          set_ints(n, "split", {1, 2, 1});
                        },
                        11, 3),
                    {false, true, false});
  }
}

TEST_CASE("grad Slice") {
  SUBCASE("opset 1 attributes") {
    gradcheck(make_case(
        "Slice", {random_tensor({4, 5, 3})}, {true},
        [](onnx::NodeProto& n) {
          set_ints(n, "starts", {1, 1});
          set_ints(n, "ends", {3, 5});
          set_ints(n, "axes", {0, 1});
        },
        1));
  }
  SUBCASE("inputs with steps") {
    gradcheck_const(
        make_case("Slice",
                  {random_tensor({6, 5, 4}), int64_tensor({2}, {0, 1}), int64_tensor({2}, {6, 4}),
                   int64_tensor({2}, {0, 2}), int64_tensor({2}, {2, 2})},
                  {true, false, false, false, false}));
  }
  SUBCASE("negative step, default axes") {
    gradcheck_const(make_case("Slice",
                              {random_tensor({5, 4}), int64_tensor({2}, {4, -1}),
                               int64_tensor({2}, {0, -5}), Tensor{}, int64_tensor({2}, {-2, -1})},
                              {true, false, false, false, false}));
  }
  SUBCASE("negative starts, ends past the dims") {
    gradcheck_const(make_case("Slice",
                              {random_tensor({4, 6}), int64_tensor({2}, {-3, 2}),
                               int64_tensor({2}, {100, -1}), int64_tensor({2}, {0, 1})},
                              {true, false, false, false}));
  }
  SUBCASE("starts and ends only") {
    gradcheck_const(make_case(
        "Slice", {random_tensor({3, 6}), int64_tensor({2}, {1, 2}), int64_tensor({2}, {3, 5})},
        {true, false, false}));
  }
}

TEST_CASE("grad Gather") {
  SUBCASE("axis 0, repeated and negative indices") {
    gradcheck_const(make_case("Gather",
                              {random_tensor({5, 3}), int64_tensor({2, 3}, {0, 4, -1, 2, 0, 0})},
                              {true, false}));
  }
  SUBCASE("axis 1") {
    gradcheck_const(make_case("Gather", {random_tensor({2, 4, 3}), int64_tensor({3}, {3, 1, 3})},
                              {true, false}, [](onnx::NodeProto& n) { set_int(n, "axis", 1); }));
  }
  SUBCASE("scalar index, last axis") {
    gradcheck_const(make_case("Gather", {random_tensor({2, 4}), int64_tensor({}, {-2})},
                              {true, false}, [](onnx::NodeProto& n) { set_int(n, "axis", -1); }));
  }
  SUBCASE("indices as a graph input") {
    gradcheck(make_case("Gather", {random_tensor({6, 2}), int64_tensor({4}, {5, 1, 1, 0})},
                        {true, false}));
  }
}

TEST_CASE("grad data: large (threaded paths)") {
  auto large = [](GradCase c) {
    c.samples = 12;
    return c;
  };
  gradcheck(
      large(make_case("Transpose", {random_tensor({40, 30, 30})}, {true}, [](onnx::NodeProto& n) {
        set_ints(n, "perm", {2, 0, 1});
      })));
  std::vector<int64_t> indices(60);
  for (int64_t i = 0; i < 60; ++i) indices[i] = (i * 7) % 10 - 5;  // repeats and negatives
  GradCase gather =
      make_case("Gather", {random_tensor({10, 600}), int64_tensor({60}, indices)}, {true, false});
  gather.samples = 40;
  gradcheck_const(gather);
  gradcheck(large(make_case("ReduceMean", {random_tensor({30, 40, 30})}, {true},
                            [](onnx::NodeProto& n) { set_ints(n, "axes", {1}); })));
  gradcheck_const(large(make_case(
      "Expand", {random_tensor({40, 1, 30}), int64_tensor({3}, {40, 30, 30})}, {true, false})));
}

TEST_CASE("grad Expand") {
  gradcheck_const(
      make_case("Expand", {random_tensor({3, 1}), int64_tensor({3}, {2, 3, 4})}, {true, false}));
  gradcheck_const(
      make_case("Expand", {random_tensor({1, 4}), int64_tensor({2}, {3, 1})}, {true, false}));
  gradcheck_const(
      make_case("Expand", {random_tensor({}), int64_tensor({2}, {2, 3})}, {true, false}));
  gradcheck_const(
      make_case("Expand", {random_tensor({2, 3}), int64_tensor({2}, {2, 3})}, {true, false}));
}

// Trilu on activations (torch.tril / torch.triu): dX is dY inside the triangle; k takes none.
TEST_CASE("grad Trilu") {
  for (int64_t upper : {0, 1}) {
    CAPTURE(upper);
    gradcheck(make_case("Trilu", {random_tensor({2, 3, 4})}, {true},
                        [=](onnx::NodeProto& n) { set_int(n, "upper", upper); }));
    for (int64_t k : {-1, 2}) {
      CAPTURE(k);
      gradcheck_const(make_case("Trilu", {random_tensor({3, 5}), int64_tensor({}, {k})},
                                {true, false},
                                [=](onnx::NodeProto& n) { set_int(n, "upper", upper); }));
    }
  }
}

TEST_CASE("grad ReduceMean") {
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true}));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_ints(n, "axes", {-1}); }));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "axes", {0, 2});
    set_int(n, "keepdims", 0);
  }));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true}, [](onnx::NodeProto& n) {
    set_ints(n, "axes", {1});
    set_int(n, "keepdims", 0);
  }));
  gradcheck(make_case("ReduceMean", {random_tensor({2, 3, 4})}, {true},
                      [](onnx::NodeProto& n) { set_int(n, "keepdims", 0); }));
}

}  // namespace stagecraft::testing

// Finite-difference checks of LSTMGrad, GRUGrad and RNNGrad (runtime/cpu/rnn.cpp over
// rnn_core.h): dX, dW, dR, dB, dinitial_h, dinitial_c and dP, forward, reverse and
// bidirectional, GRU with linear_before_reset 0 and 1, with every output's gradient or only
// some (a language model reads Y alone; an encoder Y_h alone).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;

struct Options {
  std::string direction = "forward";
  bool bias = true, initial = true, peephole = false;
  int64_t linear_before_reset = -1;  // GRU: set when >= 0
  std::vector<bool> no_dy{};
  bool hidden_attr = true;
};

// X [T, B, I]; `gates` 4 (LSTM), 3 (GRU) or 1 (RNN).
void recurrent(const std::string& op, int64_t t, int64_t b, int64_t i, int64_t h,
               const Options& o) {
  CAPTURE(op);
  CAPTURE(o.direction);
  CAPTURE(o.linear_before_reset);
  const int64_t g = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
  const int64_t d = o.direction == "bidirectional" ? 2 : 1;
  GradCase c;
  c.op = op;
  c.inputs = {random_tensor({t, b, i}, -1, 1, 1), random_tensor({d, g * h, i}, -0.6f, 0.6f, 2),
              random_tensor({d, g * h, h}, -0.6f, 0.6f, 3)};
  c.check = {true, true, true};
  auto add = [&](rt::Tensor tensor, bool check) {
    c.inputs.push_back(std::move(tensor));
    c.check.push_back(check);
  };
  const bool lstm = op == "LSTM";
  const bool more = o.initial || o.peephole;
  if (o.bias || more) add(o.bias ? random_tensor({d, 2 * g * h}, -0.5f, 0.5f, 4) : rt::Tensor{}, o.bias);
  if (more) {
    add(rt::Tensor{}, false);  // sequence_lens
    add(o.initial ? random_tensor({d, b, h}, -1, 1, 5) : rt::Tensor{}, o.initial);
    if (lstm) add(o.initial ? random_tensor({d, b, h}, -1, 1, 6) : rt::Tensor{}, o.initial);
    if (lstm && o.peephole) add(random_tensor({d, 3 * h}, -0.5f, 0.5f, 7), true);
  }
  c.outputs = lstm ? 3 : 2;
  c.no_dy = o.no_dy;
  c.attrs = [=](onnx::NodeProto& n) {
    if (o.hidden_attr) set_int(n, "hidden_size", h);
    set_string(n, "direction", o.direction);
    if (o.linear_before_reset >= 0) set_int(n, "linear_before_reset", o.linear_before_reset);
  };
  gradcheck(c);
}

}  // namespace

TEST_CASE("grad LSTM") {
  recurrent("LSTM", 4, 2, 3, 5, {});
  recurrent("LSTM", 3, 2, 3, 4, {.direction = "reverse"});
  recurrent("LSTM", 3, 2, 3, 4, {.direction = "bidirectional"});
  recurrent("LSTM", 3, 3, 2, 3, {.direction = "bidirectional", .peephole = true});
  recurrent("LSTM", 4, 2, 3, 4, {.bias = false, .initial = false});
  // A language model reads Y only; an encoder Y_h and Y_c only.
  recurrent("LSTM", 3, 2, 3, 4, {.no_dy = {false, true, true}});
  recurrent("LSTM", 3, 2, 3, 4, {.direction = "bidirectional", .no_dy = {true, false, false}});
}

TEST_CASE("grad GRU") {
  for (int64_t lbr : {0, 1}) {
    recurrent("GRU", 4, 2, 3, 5, {.linear_before_reset = lbr});
    recurrent("GRU", 3, 2, 3, 4, {.direction = "reverse", .linear_before_reset = lbr});
    recurrent("GRU", 3, 2, 3, 4, {.direction = "bidirectional", .linear_before_reset = lbr});
    recurrent("GRU", 3, 2, 3, 4,
              {.bias = false, .initial = false, .linear_before_reset = lbr, .no_dy = {false, true}});
  }
}

TEST_CASE("grad RNN") {
  recurrent("RNN", 4, 2, 3, 5, {});
  recurrent("RNN", 3, 2, 3, 4, {.direction = "bidirectional"});
  recurrent("RNN", 3, 2, 3, 4, {.direction = "reverse", .no_dy = {true, false}});
  recurrent("RNN", 3, 2, 3, 4, {.bias = false, .initial = false, .hidden_attr = true});
}

}  // namespace stagecraft::testing

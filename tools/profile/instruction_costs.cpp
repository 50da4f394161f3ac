#include "tools/profile/instruction_costs.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/exec/transport.h"
#include "runtime/format/schedule.h"

namespace stagecraft::profile {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 50;
constexpr int kRepetitions = 1000;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double since_ms(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

rt::Message one_float_message(int microbatch) {
  rt::Message m{microbatch, {}};
  m.tensors.push_back({"x", rt::Tensor::owned(DType::kFloat32, {1})});
  return m;
}

/// The median of a send into a link with room (its receive, untimed, empties it again).
double measure_send() {
  const rt::Link link{0, 1, false};
  rt::InProcessTransport transport({link}, 2);
  std::vector<double> samples;
  for (int i = 0; i < kWarmup + kRepetitions; ++i) {
    rt::Message m = one_float_message(i);
    const auto start = Clock::now();
    transport.send(link, std::move(m));
    const double ms = since_ms(start);
    transport.recv(link, i);
    if (i >= kWarmup) samples.push_back(ms);
  }
  return median(samples);
}

/// Half the median round trip of a message to a worker thread and back.
double measure_hand_off() {
  const rt::Link there{0, 1, false}, back{1, 0, true};
  rt::InProcessTransport transport({there, back}, 2);
  const int total = kWarmup + kRepetitions;
  std::thread echo([&] {
    for (int i = 0; i < total; ++i) transport.send(back, transport.recv(there, i));
  });
  std::vector<double> samples;
  for (int i = 0; i < total; ++i) {
    rt::Message m = one_float_message(i);
    const auto start = Clock::now();
    transport.send(there, std::move(m));
    transport.recv(back, i);
    if (i >= kWarmup) samples.push_back(since_ms(start) / 2);
  }
  echo.join();
  return median(samples);
}

}  // namespace

std::map<std::string, double> measure_instruction_costs(int threads, std::string_view backend) {
  using schedule::Op;
  const double program = measure_empty_program(threads, backend);
  const double send = measure_send();
  const double hand_off = measure_hand_off();
  std::map<std::string, double> out;
  for (Op op :
       {Op::kForward, Op::kBackward, Op::kBackwardInput, Op::kBackwardWeight, Op::kOptimizerStep})
    out[schedule::to_string(op)] = program;
  for (Op op : {Op::kSendAct, Op::kSendGrad}) out[schedule::to_string(op)] = send;
  for (Op op : {Op::kRecvAct, Op::kRecvGrad, Op::kAllReduce, Op::kAllReduceShared})
    out[schedule::to_string(op)] = hand_off;
  return out;
}

}  // namespace stagecraft::profile

// The runtime's pieces on their own: tensors, .npy and TensorProto files, the static memory
// plan, channels and the step barrier, stage programs and their refusals.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/core/tensor_io.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/exec/transport.h"
#include "runtime/format/error.h"
#include "runtime/format/memory_plan.h"
#include "tests/runtime/fake_gpus.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

TEST_CASE("a kept view shares its source's own bytes: no copy, and the arena may be reused") {
  // x [2, 6] -> Relu -> r -> Reshape [3, 4] -> v -> Relu -> y; the backward would keep v.
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto* g = model.mutable_graph();
  testing::add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 6});
  testing::add_tensor_info(g->add_value_info(), "r", onnx::TensorProto::FLOAT, {2, 6});
  testing::add_tensor_info(g->add_value_info(), "v", onnx::TensorProto::FLOAT, {3, 4});
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {3, 4});
  testing::add_int64_initializer(g, "shape", {3, 4});
  testing::add_node(g, "Relu", {"x"}, {"r"}, "relu");
  testing::add_node(g, "Reshape", {"r", "shape"}, {"v"}, "reshape");
  testing::add_node(g, "Relu", {"v"}, {"y"}, "relu2");
  Program program = Program::from_model(model, cpu_backend(), "view.onnx");
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::string> ran;
  NodeHook hook;
  hook.timed = [&](std::string_view, std::string_view op, double, const NodeWork&,
                   std::string_view) { ran.emplace_back(op); };
  std::vector<std::byte> arena(program.arena_bytes() + 64);
  auto input = [](float sign) {
    Tensor x = Tensor::owned(DType::kFloat32, {2, 6});
    for (int i = 0; i < 12; ++i) x.as<float>()[i] = sign * (static_cast<float>(i) - 3.5f);
    return x;
  };
  std::map<std::string, Tensor> kept;
  const Tensor x1 = input(1.0f);
  program.run_keeping(*device, {&x1, 1}, kept, {"v"}, arena.data(), &hook);
  CHECK(ran == std::vector<std::string>{"Relu", "Relu"});  // the Reshape copied nothing
  REQUIRE(kept.count("v") == 1);
  const Tensor v = kept.at("v");
  CHECK(v.shape == Shape{3, 4});
  CHECK(v.storage != nullptr);
  // Another run over the same arena leaves the kept bytes as they were: they are not arena's.
  const Tensor x2 = input(-1.0f);
  std::map<std::string, Tensor> other;
  program.run_keeping(*device, {&x2, 1}, other, {}, arena.data());
  for (int i = 0; i < 12; ++i) CHECK(v.as<float>()[i] == std::max(0.0f, static_cast<float>(i) - 3.5f));
}

TEST_CASE("memory the machine cannot give is a one-line memory error, not an internal one") {
  // Issue 17, finding 8: a bad_alloc was reported as "internal error: std::bad_alloc".
  // 2^48 floats (1 PiB) is more than any address space gives; aligned_alloc returns null.
  try {
    Tensor::owned(DType::kFloat32, {int64_t{1} << 48});
    FAIL("a 1 PiB tensor was allocated");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kMemory);
    CHECK(std::string(e.what()) ==
          "out of memory: a tensor of float32[281474976710656] needs 1125899906842624 bytes "
          "(1048576.00 GiB)");
  }
  // A bad_alloc from anywhere else keeps the context it passes through.
  try {
    with_context("stage_1.onnx", ErrorKind::kModel, []() -> int { throw std::bad_alloc(); });
    FAIL("with_context swallowed the bad_alloc");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kMemory);
    CHECK(std::string(e.what()).starts_with("stage_1.onnx: out of memory: "));
  }
  CHECK(error_from(std::runtime_error("boom"), ErrorKind::kInternal).kind() == ErrorKind::kInternal);
  CHECK(to_string(ErrorKind::kMemory) == "memory");
  CHECK(exit_code(ErrorKind::kMemory) == 1);
  CHECK(run_main("test", []() -> int { throw std::bad_alloc(); }) == 1);
  CHECK(run_main("test", []() -> int { throw std::logic_error("bug"); }) == 70);
}

TEST_CASE("rows of a tensor are views and join back to the same bytes") {
  Tensor t = Tensor::owned(DType::kFloat32, {4, 3});
  for (int i = 0; i < 12; ++i) t.as<float>()[i] = static_cast<float>(i);
  Tensor mid = slice_rows(t, 1, 3);
  CHECK(mid.shape == Shape{2, 3});
  CHECK(mid.as<float>()[0] == 3.0f);
  CHECK(mid.data == t.data + 12);  // no copy
  Tensor joined = concat_rows({slice_rows(t, 0, 1), slice_rows(t, 1, 4)});
  CHECK(joined.shape == t.shape);
  CHECK(std::equal(joined.as<float>(), joined.as<float>() + 12, t.as<float>()));
  CHECK_THROWS_AS(slice_rows(t, 2, 5), Error);
  Tensor scalar = Tensor::owned(DType::kFloat32, {});
  CHECK(concat_rows({scalar, scalar}).shape == Shape{2});
}

TEST_CASE(
    "a cpu device's large tensors reuse freed buffers of their size and still start at zero") {
  auto device = cpu_backend().make_device(0, 1);
  auto& cpu = static_cast<cpu::CpuContext&>(*device);
  const Shape big{256, 1024};  // 1 MiB of float32: pooled
  std::byte* first = nullptr;
  {
    Tensor t = cpu.new_tensor(DType::kFloat32, big, true);
    first = t.data;
    std::fill_n(t.as<float>(), t.numel(), 7.0f);
    CHECK(cpu.pooled_bytes() == 0);
  }
  CHECK(cpu.pooled_bytes() == 1 << 20);  // freed into the pool, not to the system
  Tensor again = cpu.new_tensor(DType::kFloat32, big, true);
  CHECK(again.data == first);  // the same pages
  CHECK(cpu.pooled_bytes() == 0);
  CHECK(std::all_of(again.as<float>(), again.as<float>() + again.numel(),
                    [](float v) { return v == 0.0f; }));
  Tensor other = cpu.new_tensor(DType::kFloat32, {128, 1024}, false);  // another size: new buffer
  CHECK(other.data != first);
  Tensor small = cpu.new_tensor(DType::kFloat32, {4}, true);  // below kPooledBytes: not pooled
  small = Tensor{};
  CHECK(cpu.pooled_bytes() == 0);
  other = Tensor{};
  CHECK(cpu.pooled_bytes() == 1 << 19);
  cpu.release_pooled_buffers();
  CHECK(cpu.pooled_bytes() == 0);
  // A pooled tensor outlives its device: the pool stays until the tensor goes.
  Tensor kept = cpu.new_tensor(DType::kFloat32, big, false);
  device.reset();
  kept.as<float>()[0] = 1.0f;
  kept = Tensor{};
  // Every other device op of the cpu backend on host memory.
  auto second = cpu_backend().make_device(1, 1);
  Tensor a = second->new_tensor(DType::kFloat32, {3}, true), b = scalar_on(*second, 2.0f);
  const float host[3] = {1, 2, 3};
  second->write(a, host, sizeof host);
  Tensor c = clone_on(*second, a);
  second->accumulate(c, a);
  float back[3] = {};
  second->read(c, back, sizeof back);
  CHECK(back[2] == 6.0f);
  CHECK(read_float(*second, b) == 2.0f);
  second->fill_zero(c);
  CHECK(c.as<float>()[1] == 0.0f);
  CHECK_THROWS_AS(second->write(a, host, 8), Error);
  CHECK_THROWS_AS(second->accumulate(c, b), Error);
  auto arena = second->allocate(100);
  CHECK(arena->size() == 100);
  CHECK(reinterpret_cast<uintptr_t>(arena->base()) % plan::kArenaAlignment == 0);
}

TEST_CASE("backends are asked for by name, and an unknown name lists the known ones") {
  CHECK(&backend_by_name("cpu") == &cpu_backend());
  CHECK(backend_names() == std::vector<std::string_view>{"cpu", "cuda"});
  CHECK_THROWS_WITH_AS(backend_by_name("tpu"),
                       doctest::Contains("unknown backend 'tpu' (valid: auto, cpu, cuda)"), Error);
  // "cuda" without a GPU: tests/gpu/cuda_backend_test.cpp.
}

TEST_CASE(".npy files round-trip and bad ones are refused with the file named") {
  testing::TempDir dir;
  for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kBool, DType::kFloat64}) {
    Tensor t = Tensor::owned(dtype, {2, 3, 1});
    for (int64_t i = 0; i < t.bytes(); ++i)
      t.data[i] = static_cast<std::byte>(dtype == DType::kBool ? i % 2 : i);
    std::string path = dir.file("t.npy");
    write_npy(path, t);
    Tensor back = read_npy(path);
    CHECK(back.dtype == dtype);
    CHECK(back.shape == t.shape);
    CHECK(std::equal(back.data, back.data + back.bytes(), t.data));
  }
  Tensor scalar = Tensor::owned(DType::kFloat32, {});
  write_npy(dir.file("s.npy"), scalar);
  CHECK(read_npy(dir.file("s.npy")).shape.empty());

  std::ofstream(dir.file("bad.npy")) << "not numpy";
  CHECK_THROWS_WITH_AS(read_npy(dir.file("bad.npy")), doctest::Contains("bad.npy: not a .npy file"),
                       Error);
  // A header that promises more data than the file holds.
  Tensor big = Tensor::owned(DType::kFloat32, {100});
  write_npy(dir.file("short.npy"), big);
  std::filesystem::resize_file(dir.file("short.npy"), 200);
  CHECK_THROWS_WITH_AS(read_npy(dir.file("short.npy")), doctest::Contains("the file is shorter"),
                       Error);
  CHECK_THROWS_WITH_AS(read_npy(dir.file("missing.npy")),
                       doctest::Contains("missing.npy: cannot open"), Error);
}

/// Writes a version-1 .npy file with `header` (padded as numpy pads it) and `data` bytes.
void write_raw_npy(const std::string& path, std::string header, const std::string& data) {
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(header.size() & 0xff)).put(static_cast<char>(header.size() >> 8));
  out << header << data;
}

TEST_CASE(".npy headers from a hostile file are refused in one line, before any allocation") {
  testing::TempDir dir;
  auto refused = [&](const std::string& header, const std::string& needle) {
    write_raw_npy(dir.file("h.npy"), header, std::string(64, '\0'));
    CHECK_THROWS_WITH_AS(read_npy(dir.file("h.npy")), doctest::Contains(needle.c_str()), Error);
  };
  // Issue 17: a 30 KB descr overflowed std::regex's stack (SIGSEGV).
  refused("{'descr': '" + std::string(30000, 'x') + "', 'fortran_order': False, 'shape': (2,), }",
          "a string longer than 64 characters");
  // Issue 17: float32[536870912] allocated and zeroed 2 GiB before finding the file short.
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (536870912,), }",
          "float32[536870912] needs 2147483648 bytes of data; the file is shorter (holds 64)");
  // Issue 17: (2^60,) overflowed numel x size in Tensor::allocate.
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (1152921504606846976,), }",
          "needs 4611686018427387904 bytes of data; the file is shorter");
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }",
          "needs more than 2^63 bytes of data");
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
          "overflows int64");
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
          "a dim is not a non-negative int64");
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }",
          "a dim is not a non-negative int64");
  refused("{'descr': '<f4', 'fortran_order': False, }", "no 'shape'");
  refused("{'descr': '<f4', 'shape': (2,), }", "no 'fortran_order'");
  refused("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", "expected True or False");
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", "unknown key 'x'");
  refused("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "expected ',' or ')'");
  refused("{'descr': '<f4", "unterminated string");
  refused("'descr'", "expected '{'");
  // What numpy writes, in any key order and either quote, still reads.
  write_raw_npy(dir.file("ok.npy"), "{\"shape\": (2, 3), 'fortran_order': False, 'descr': '<f4'}",
                std::string(24, '\0'));
  CHECK(read_npy(dir.file("ok.npy")).shape == Shape{2, 3});
}

TEST_CASE("a tensor whose byte size overflows int64 is refused, not allocated") {
  CHECK_THROWS_WITH_AS(Tensor::owned(DType::kFloat32, {int64_t{1} << 62}),
                       doctest::Contains("would hold more than 2^63 bytes"), Error);
}

TEST_CASE("a TensorProto whose data does not match its dims is refused before allocating") {
  onnx::TensorProto proto;
  proto.set_data_type(onnx::TensorProto::FLOAT);
  proto.add_dims(1LL << 40);
  proto.add_float_data(1.0f);
  CHECK_THROWS_WITH_AS(tensor_from_proto(proto, "initializer 'w'"),
                       doctest::Contains("initializer 'w' holds 1 values"), Error);
}

TEST_CASE("the memory plan never overlaps tensors alive together and reuses dead ones") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<plan::Lifetime> lifetimes;
    int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      int first = static_cast<int>(rng() % 30);
      lifetimes.push_back(
          {static_cast<int64_t>(1 + rng() % 5000), first, first + static_cast<int>(rng() % 6)});
    }
    plan::MemoryPlan mp = plan::plan_memory(lifetimes);
    CHECK_NOTHROW(plan::check_memory_plan(lifetimes, mp, "random"));
    // Never more than everything side by side, never less than the busiest step.
    int64_t sum = 0, busiest = 0;
    for (const auto& l : lifetimes) sum += (l.bytes + 63) / 64 * 64;
    for (int step = 0; step < 40; ++step) {
      int64_t live = 0;
      for (const auto& l : lifetimes)
        if (l.first <= step && step <= l.last) live += l.bytes;
      busiest = std::max(busiest, live);
    }
    CHECK(mp.arena_bytes <= sum);
    CHECK(mp.arena_bytes >= busiest);
  }
  // A chain a -> b -> c: a and c never live together, so they share bytes.
  std::vector<plan::Lifetime> chain = {{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}};
  CHECK(plan::plan_memory(chain).arena_bytes == 2 * 1024);
  plan::MemoryPlan bad{{0, 0, 0}, 1024};
  CHECK_THROWS_WITH_AS(
      plan::check_memory_plan(chain, bad, "stage_0.onnx"),
      doctest::Contains("stage_0.onnx: tensors 0 and 1 are alive together but overlap"), Error);
  // An edited plan's offset near 2^63: offset + bytes would wrap negative and pass a naive check
  // (issue 17: a kernel then wrote at arena + 2^63).
  plan::MemoryPlan wrapping{{0, 1024, std::numeric_limits<int64_t>::max() - 63}, 2 * 1024};
  CHECK_THROWS_WITH_AS(plan::check_memory_plan(chain, wrapping, "stage_0.onnx"),
                       doctest::Contains("tensor 2 at offset 9223372036854775744 (1000 bytes) "
                                         "lies outside the 2048-byte arena"),
                       Error);
}

TEST_CASE("channels deliver in order, bound the sender, and abort wakes every waiter") {
  Link link{0, 1, false};
  InProcessTransport transport({link}, 2);
  transport.send(link, {0, {}});
  transport.send(link, {1, {}});
  CHECK(transport.recv(link, 0).microbatch == 0);
  CHECK_THROWS_WITH_AS(transport.recv(link, 5), doctest::Contains("expected microbatch 5"), Error);
  CHECK_THROWS_AS(transport.recv({1, 2, false}, 0), Error);  // no such link

  InProcessTransport idle({link}, 1);
  StepBarrier barrier(2);
  std::atomic<int> woken{0};
  std::thread waiter([&] {
    try {
      idle.recv(link, 0);
    } catch (const Aborted&) {
      ++woken;
    }
  });
  std::thread at_barrier([&] {
    try {
      barrier.arrive_and_wait();
    } catch (const Aborted&) {
      ++woken;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  idle.abort();
  barrier.abort();
  waiter.join();
  at_barrier.join();
  CHECK(woken == 2);
}

TEST_CASE("waiters that spin before they sleep: order, wake-ups, timeouts and aborts hold") {
  using std::chrono::microseconds;
  using std::chrono::milliseconds;
  const Link there{0, 1, false}, back{1, 0, true};
  for (int spin_us : {1, 100'000}) {  // the sleep path after a short spin, and all spinning
    CAPTURE(spin_us);
    InProcessTransport transport({there, back}, 1);
    transport.set_spin(microseconds(spin_us));
    StepBarrier barrier(2);
    barrier.set_spin(microseconds(spin_us));
    constexpr int kRounds = 300;
    std::vector<int> echoed;
    std::thread echo([&] {
      for (int i = 0; i < kRounds; ++i) {
        Message m = transport.recv(there, i);
        echoed.push_back(m.microbatch);
        transport.send(back, std::move(m));
        if (i % 50 == 0) barrier.arrive_and_wait();
      }
    });
    for (int i = 0; i < kRounds; ++i) {
      if (i % 100 == 1) std::this_thread::sleep_for(milliseconds(5));  // the other side waits
      transport.send(there, {i, {}});
      CHECK(transport.recv(back, i).microbatch == i);
      if (i % 50 == 0) barrier.arrive_and_wait();
    }
    echo.join();
    CHECK(echoed.size() == kRounds);
    CHECK(std::is_sorted(echoed.begin(), echoed.end()));
  }
  // A spin longer than the timeout ends at the timeout, and abort wakes a spinning waiter.
  InProcessTransport slow({back}, 1, {}, 0.05);
  slow.set_spin(microseconds(10'000'000));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(slow.recv(back, 0), doctest::Contains("for 0.05 s"), Error);
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= milliseconds(50));
  CHECK(waited < milliseconds(5000));
  InProcessTransport idle({there}, 1);
  idle.set_spin(microseconds(10'000'000));
  std::atomic<bool> aborted{false};
  std::thread waiter([&] {
    try {
      idle.recv(there, 0);
    } catch (const Aborted&) {
      aborted = true;
    }
  });
  std::this_thread::sleep_for(milliseconds(20));
  idle.abort();
  waiter.join();
  CHECK(aborted);
}

TEST_CASE("a wait past the transport's timeout names the link and the seconds") {
  Link link{1, 0, true};
  InProcessTransport transport({link}, 1, {}, 0.05);
  auto start = std::chrono::steady_clock::now();
  try {
    transport.recv(link, 0);
    FAIL("a receive with nothing sent returned");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kTimeout);
    CHECK(std::string(e.what()) ==
          "nothing arrived on the link stage 1 -> stage 0 (gradients) for 0.05 s: its device's "
          "worker stopped answering (--timeout)");
  }
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(50));
  transport.send(link, {0, {}});  // fills the link (capacity 1)
  CHECK_THROWS_WITH_AS(transport.send(link, {1, {}}),
                       doctest::Contains("stage 0 took nothing from the full link stage 1 -> "
                                         "stage 0 (gradients) for 0.05 s"),
                       Error);
}

// A one-node model: y = OP(x) with x float32[2, 3].
onnx::ModelProto one_node_model(const std::string& op) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto* g = model.mutable_graph();
  testing::add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 3});
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {2, 3});
  testing::add_node(g, op, {"x"}, {"y"}, "the_node");
  return model;
}

TEST_CASE("a program refuses an op the backend lacks, naming the file and the node") {
  CHECK_THROWS_WITH_AS(
      Program::from_model(one_node_model("NoSuchOp"), cpu_backend(), "stage_3.onnx"),
      "stage_3.onnx: node 'the_node': op 'NoSuchOp' has no cpu kernel", Error);
  onnx::ModelProto unknown_shape = one_node_model("Identity");
  unknown_shape.mutable_graph()
      ->mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_param("batch");
  CHECK_THROWS_WITH_AS(Program::from_model(unknown_shape, cpu_backend(), "s.onnx"),
                       doctest::Contains("tensor 'y' has no static shape (dim 'batch')"), Error);
}

TEST_CASE("a program checks the dtype and shape of what it is given") {
  Program program = Program::from_model(one_node_model("Relu"), cpu_backend(), "relu.onnx");
  auto device = cpu_backend().make_device(0, 1);
  Tensor wrong = Tensor::owned(DType::kFloat32, {3, 2});
  CHECK_THROWS_WITH_AS(program.run(*device, {&wrong, 1}, nullptr),
                       "relu.onnx: input 'x' is float32[3, 2] but the program takes float32[2, 3]",
                       Error);
  Tensor x = Tensor::owned(DType::kFloat32, {2, 3});
  for (int i = 0; i < 6; ++i) x.as<float>()[i] = static_cast<float>(i - 3);
  std::vector<std::byte> arena(program.arena_bytes() + 64);
  std::vector<Tensor> y = program.run(*device, {&x, 1}, arena.data());
  REQUIRE(y.size() == 1);
  CHECK(y[0].as<float>()[0] == 0.0f);
  CHECK(y[0].as<float>()[5] == 2.0f);
}

using FakeGpuBackend = FakeGpus;

TEST_CASE(
    "plan devices sharing a GPU are named in one warning, and none when each has its own GPU or "
    "runs on the CPU") {
  const std::vector<int> two{0, 1}, four{0, 1, 2, 3};
  const std::string shared = shared_device_warning(FakeGpuBackend(1), two);
  CHECK(shared.find("the plan's 2 devices run on 1 GPU (GPU 0 (fake))") != std::string::npos);
  CHECK(shared.find("--devices 1") != std::string::npos);
  CHECK(shared.find('\n') == std::string::npos);
  const std::string half = shared_device_warning(FakeGpuBackend(2), four);
  CHECK(half.find("4 devices run on 2 GPUs (GPU 0 (fake), GPU 1 (fake))") != std::string::npos);
  CHECK(shared_device_warning(FakeGpuBackend(2), two).empty());
  CHECK(shared_device_warning(FakeGpuBackend(4), four).empty());
  CHECK(shared_device_warning(cpu_backend(), four).empty());
  // Under mpirun a rank passes only its own devices: one device is never shared with itself.
  CHECK(shared_device_warning(FakeGpuBackend(1), std::vector<int>{3}).empty());
}

}  // namespace
}  // namespace stagecraft::rt

namespace stagecraft::rt {
namespace {

TEST_CASE("Gemm with an empty inner dim writes beta * C, or zeros, whatever the output held") {
  const KernelEntry* gemm = nullptr;
  for (const KernelEntry& e : cpu_backend().table())
    if (e.op_type == "Gemm") gemm = &e;
  REQUIRE(gemm != nullptr);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  Tensor a = Tensor::owned(DType::kFloat32, {2, 0});
  Tensor b = Tensor::owned(DType::kFloat32, {0, 3});
  Tensor c = Tensor::owned(DType::kFloat32, {3});
  for (int j = 0; j < 3; ++j) c.as<float>()[j] = static_cast<float>(j + 1);
  for (float beta : {0.0f, 0.5f}) {
    for (bool with_c : {false, true}) {
      CAPTURE(beta);
      CAPTURE(with_c);
      onnx::NodeProto node;
      node.set_op_type("Gemm");
      auto* attr = node.add_attribute();
      attr->set_name("beta");
      attr->set_type(onnx::AttributeProto::FLOAT);
      attr->set_f(beta);
      Attrs attrs(node);
      Tensor y = Tensor::owned(DType::kFloat32, {2, 3});
      // An arena's bytes are whatever the last tenant left: NaN here.
      for (int i = 0; i < 6; ++i) y.as<float>()[i] = std::numeric_limits<float>::quiet_NaN();
      const Tensor* in3[] = {&a, &b, &c};
      Tensor* out[] = {&y};
      std::span<const Tensor* const> in(in3, with_c ? 3 : 2);
      gemm->run(KernelArgs{"gemm", "Gemm", attrs, in, out, *device});
      for (int i = 0; i < 6; ++i) {
        float want = with_c ? beta * static_cast<float>(i % 3 + 1) : 0.0f;
        CHECK(y.as<float>()[i] == want);
      }
    }
  }
}

}  // namespace
}  // namespace stagecraft::rt

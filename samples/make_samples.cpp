// stagecraft-make-samples: writes the sample ONNX models (one per subcommand, or the
// checked-in set with `all`). The defaults of every subcommand are the checked-in models.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "samples/builder/model_builder.h"
#include "samples/builder/sample_models.h"

namespace {

using stagecraft::samples::ModelBuilder;
using stagecraft::samples::WriteOptions;
using stagecraft::samples::WriteSummary;

/// Command-line settings that apply to every single-model subcommand.
struct OutputSettings {
  std::string output;
  bool external_data = false;
  bool no_weight_bytes = false;
  int64_t threshold = 1024;
};

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}

/// Writes one model and prints one line per file written.
void write_model(const ModelBuilder& builder, const std::filesystem::path& path,
                 const WriteOptions& options) {
  const WriteSummary summary = builder.write(path, options);
  fmt::print("{}: {} parameters, {} nodes, {} bytes ({})\n", summary.model_path.string(),
             summary.parameter_count, summary.node_count, summary.model_bytes,
             human_bytes(summary.model_bytes));
  if (!summary.data_path.empty()) {
    fmt::print("{}: external data, {} bytes ({}){}\n", summary.data_path.string(),
               summary.data_bytes, human_bytes(summary.data_bytes),
               options.write_parameter_bytes ? "" : ", sparse: parameter bytes not written");
  }
}

WriteOptions write_options(const OutputSettings& settings) {
  WriteOptions options;
  options.external_data = settings.external_data || settings.no_weight_bytes;
  options.write_parameter_bytes = !settings.no_weight_bytes;
  options.external_threshold_bytes = settings.threshold;
  return options;
}

/// Adds the options every single-model subcommand has.
void add_common_options(CLI::App* command, stagecraft::samples::CommonOptions& common,
                        OutputSettings& settings) {
  command->add_option("-o,--output", settings.output, "Model file to write")->capture_default_str();
  command->add_option("--batch", common.batch, "Fixed batch size (0: symbolic \"batch\")")
      ->capture_default_str();
  command->add_option("--seed", common.seed, "Seed of the initializer values")
      ->capture_default_str();
  command->add_flag("--external-data", settings.external_data,
                    "Store large initializers in <output>.data beside the model");
  command->add_flag("--no-weight-bytes", settings.no_weight_bytes,
                    "Dry run: external data as a sparse file without parameter bytes");
  command
      ->add_option("--threshold", settings.threshold,
                   "Smallest initializer (bytes) that goes to external data")
      ->capture_default_str();
}

/// Writes the checked-in set into `directory`.
void write_all(const std::filesystem::path& directory, uint64_t seed) {
  stagecraft::samples::CommonOptions common;
  common.seed = seed;
  write_model(stagecraft::samples::build_toy(common), directory / "toy.onnx", {});
  write_model(stagecraft::samples::build_mnist({}, common), directory / "mnist_cnn.onnx", {});
  write_model(stagecraft::samples::build_resnet({}, common), directory / "resnet_small.onnx", {});
  const ModelBuilder gpt = stagecraft::samples::build_gpt({}, common);
  write_model(gpt, directory / "gpt_tiny.onnx", {});
  WriteOptions external;
  external.external_data = true;
  write_model(gpt, directory / "gpt_tiny_external" / "model.onnx", external);
}

/// Parses the command line and writes what it asks for; returns the exit code.
int run(int argc, char** argv) {
  CLI::App app{"Writes stagecraft's sample ONNX models (opset 17)."};
  app.require_subcommand(1);

  stagecraft::samples::CommonOptions common;

  CLI::App* toy = app.add_subcommand("toy", "Two-layer perceptron: x[batch,10] -> y[batch,5]");
  OutputSettings toy_settings{.output = "toy.onnx"};
  add_common_options(toy, common, toy_settings);

  stagecraft::samples::MnistOptions mnist_options;
  CLI::App* mnist = app.add_subcommand("mnist", "MNIST-size CNN: x[batch,1,28,28] -> logits");
  OutputSettings mnist_settings{.output = "mnist_cnn.onnx"};
  add_common_options(mnist, common, mnist_settings);
  mnist->add_option("--channels", mnist_options.channels, "Convolution output channels")
      ->capture_default_str();
  mnist->add_option("--pool", mnist_options.pool, "MaxPool window after the conv (1: none)")
      ->capture_default_str();
  mnist->add_option("--hidden", mnist_options.hidden, "Hidden units of the first Gemm")
      ->capture_default_str();
  mnist->add_option("--classes", mnist_options.classes, "Output classes")->capture_default_str();

  stagecraft::samples::ResNetOptions resnet_options;
  CLI::App* resnet = app.add_subcommand("resnet", "ResNet with basic blocks -> logits");
  OutputSettings resnet_settings{.output = "resnet_small.onnx"};
  add_common_options(resnet, common, resnet_settings);
  resnet->add_option("--widths", resnet_options.widths, "Channels of each stage")
      ->capture_default_str();
  resnet->add_option("--blocks", resnet_options.blocks_per_stage, "Basic blocks per stage")
      ->capture_default_str();
  resnet->add_option("--in-channels", resnet_options.in_channels, "Input image channels")
      ->capture_default_str();
  resnet->add_option("--image-size", resnet_options.image_size, "Input image side")
      ->capture_default_str();
  resnet->add_option("--classes", resnet_options.classes, "Output classes")->capture_default_str();
  resnet->add_flag("--train-bn", resnet_options.train_bn,
                   "BatchNormalization exported in train mode (training_mode=1, the running "
                   "statistics as outputs), as torch.onnx.export(..., "
                   "training=TrainingMode.TRAINING) writes it: a training plan updates them");

  stagecraft::samples::GptOptions gpt_options;
  CLI::App* gpt = app.add_subcommand("gpt", "GPT-style decoder: input_ids[batch,seq] -> logits");
  OutputSettings gpt_settings{.output = "gpt.onnx"};
  add_common_options(gpt, common, gpt_settings);
  gpt->add_option("--layers", gpt_options.layers, "Decoder layers")->capture_default_str();
  gpt->add_option("--width", gpt_options.width, "Model width (d_model)")->capture_default_str();
  gpt->add_option("--heads", gpt_options.heads, "Attention heads")->capture_default_str();
  gpt->add_option("--seq", gpt_options.seq, "Context length (positions, mask size)")
      ->capture_default_str();
  gpt->add_option("--vocab", gpt_options.vocab, "Vocabulary size")->capture_default_str();
  gpt->add_option("--ffn", gpt_options.ffn, "MLP hidden width (0: 4*width)")->capture_default_str();
  gpt->add_flag("--fixed-seq", gpt_options.fixed_seq,
                "Make the input's sequence dimension --seq instead of symbolic \"seq\"");
  gpt->add_flag("--tied", gpt_options.tied,
                "Tie the output head to the token embedding (logits = hidden x wte^T, as GPT-2)");

  stagecraft::samples::SharedChainOptions chain_options;
  CLI::App* chain = app.add_subcommand(
      "shared-chain", "Dense chain x[batch,width] -> y whose first and last layers share a weight");
  OutputSettings chain_settings{.output = "shared_chain.onnx"};
  add_common_options(chain, common, chain_settings);
  chain->add_option("--layers", chain_options.layers, "Dense layers (at least 2)")
      ->capture_default_str();
  chain->add_option("--width", chain_options.width, "Width of every layer")->capture_default_str();

  stagecraft::samples::UNetOptions unet_options;
  CLI::App* unet = app.add_subcommand(
      "unet", "U-Net encoder-decoder (ConvTranspose up-sampling): x[batch,3,size,size] -> logits");
  OutputSettings unet_settings{.output = "unet.onnx"};
  add_common_options(unet, common, unet_settings);
  unet->add_option("--in-channels", unet_options.in_channels, "Input image channels")
      ->capture_default_str();
  unet->add_option("--width", unet_options.width, "Channels of the first level")
      ->capture_default_str();
  unet->add_option("--image-size", unet_options.image_size, "Input image side (a multiple of 4)")
      ->capture_default_str();
  unet->add_option("--classes", unet_options.classes, "Output channels (classes)")
      ->capture_default_str();
  unet->add_flag("--instance-norm", unet_options.instance_norm,
                 "InstanceNormalization between each Conv and its Relu (pix2pix)");

  stagecraft::samples::RnnLmOptions lm_options;
  CLI::App* lm = app.add_subcommand(
      "rnn-lm", "Recurrent language model (LSTM, GRU or RNN layers): input_ids[batch,seq] -> logits");
  OutputSettings lm_settings{.output = "rnn_lm.onnx"};
  add_common_options(lm, common, lm_settings);
  lm->add_option("--cell", lm_options.cell, "LSTM, GRU or RNN")->capture_default_str();
  lm->add_option("--layers", lm_options.layers, "Recurrent layers")->capture_default_str();
  lm->add_option("--vocab", lm_options.vocab, "Vocabulary size")->capture_default_str();
  lm->add_option("--embed", lm_options.embed, "Embedding width")->capture_default_str();
  lm->add_option("--hidden", lm_options.hidden, "Hidden size")->capture_default_str();
  lm->add_option("--seq", lm_options.seq, "Sequence length")->capture_default_str();
  lm->add_flag("--bidirectional", lm_options.bidirectional, "Bidirectional layers");

  std::string all_directory;
  uint64_t all_seed = common.seed;
  CLI::App* all = app.add_subcommand("all", "Write the checked-in sample set");
  all->add_option("--out", all_directory, "Directory to write into")->required();
  all->add_option("--seed", all_seed, "Seed of the initializer values")->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }

  if (all->parsed()) {
    write_all(all_directory, all_seed);
  } else if (toy->parsed()) {
    write_model(stagecraft::samples::build_toy(common), toy_settings.output,
                write_options(toy_settings));
  } else if (mnist->parsed()) {
    write_model(stagecraft::samples::build_mnist(mnist_options, common), mnist_settings.output,
                write_options(mnist_settings));
  } else if (resnet->parsed()) {
    write_model(stagecraft::samples::build_resnet(resnet_options, common), resnet_settings.output,
                write_options(resnet_settings));
  } else if (gpt->parsed()) {
    write_model(stagecraft::samples::build_gpt(gpt_options, common), gpt_settings.output,
                write_options(gpt_settings));
  } else if (unet->parsed()) {
    write_model(stagecraft::samples::build_unet(unet_options, common), unet_settings.output,
                write_options(unet_settings));
  } else if (lm->parsed()) {
    write_model(stagecraft::samples::build_rnn_lm(lm_options, common), lm_settings.output,
                write_options(lm_settings));
  } else if (chain->parsed()) {
    write_model(stagecraft::samples::build_shared_chain(chain_options, common),
                chain_settings.output, write_options(chain_settings));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    fmt::print(stderr, "stagecraft-make-samples: error: {}\n", error.what());
    return 1;
  }
}

// The assertions of tests/profile/calibration_loop_test.sh on the two plans it made: the first
// plan's instruction costs come from the profile, the second's from the calibration, and (with
// ACCURACY 1) the calibrated prediction is within 5% of the traced median step, or closer to it
// than the uncalibrated prediction of the same split. A C++ program, not a python3 script: a fresh
// machine that runs the tests has no python3.
// Usage: stagecraft-calibration-check BEFORE_PLAN_JSON AFTER_PLAN_JSON ACCURACY(0|1)
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

nlohmann::json read_json(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot open ") + path);
  return nlohmann::json::parse(in);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s BEFORE_PLAN_JSON AFTER_PLAN_JSON ACCURACY(0|1)\n", argv[0]);
    return 2;
  }
  try {
    const nlohmann::json before = read_json(argv[1]);
    const nlohmann::json after = read_json(argv[2]);
    const bool check = std::string(argv[3]) == "1";
    const nlohmann::json& costs = after.at("instruction_costs");
    const std::string after_source = costs.at("source").get<std::string>();
    const std::string before_source = before.at("instruction_costs").at("source").get<std::string>();
    if (after_source != "calibration") {
      std::printf("FAIL: the second plan's instruction_costs.source is '%s', not 'calibration'\n",
                  after_source.c_str());
      return 1;
    }
    if (before_source != "profile") {
      std::printf("FAIL: the first plan's instruction_costs.source is '%s', not 'profile'\n",
                  before_source.c_str());
      return 1;
    }
    const double measured = costs.at("measured_step_ms").get<double>();
    const double uncalibrated = costs.at("uncalibrated_step_ms").get<double>();
    const double calibrated = after.at("predicted").at("step_ms").get<double>();
    const double predicted_before = before.at("predicted").at("step_ms").get<double>();
    std::printf("trace median step %.3f ms; predicted before %.3f ms, calibrated %.3f ms "
                "(uncalibrated, same split %.3f ms)\n",
                measured, predicted_before, calibrated, uncalibrated);
    const double error = std::fabs(calibrated - measured);
    const double before_error = std::fabs(uncalibrated - measured);
    if (check && error > std::fmax(0.05 * measured, before_error)) {
      std::printf("FAIL: calibrated prediction %.3f ms is %.1f%% off the measured %.3f ms "
                  "(uncalibrated %.1f%%)\n",
                  calibrated, 100 * error / measured, measured, 100 * before_error / measured);
      return 1;
    }
    std::printf("PASS\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}

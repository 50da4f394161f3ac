// The assertions of tests/profile/calibration_loop_test.sh on the two plans it made: the first
// plan's instruction costs come from the profile, the second's from the calibration, and (with
// ACCURACY 1) the calibrated prediction is within 5% of the traced median step, or closer to it
// than the uncalibrated prediction of the same split. Given stagedump --json of the second plan,
// its "instruction_costs" must be the plan's; given a third plan, made with the same calibration
// and other cuts, each of its stages must get its own ops' factors (cost_models/calibration.h: the
// factors follow the ops), which differ from the second plan's stage factors. A C++ program, not
// a python3 script: a fresh machine that runs the tests has no python3.
// Usage: stagecraft-calibration-check BEFORE_PLAN_JSON AFTER_PLAN_JSON ACCURACY(0|1)
//          [AFTER_DUMP_JSON [MOVED_PLAN_JSON]]
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

nlohmann::json read_json(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot open ") + path);
  return nlohmann::json::parse(in);
}

/// The factor of `kind` an op gets from plan.json's "op_factors" table of that kind.
double op_factor(const nlohmann::json& table, const nlohmann::json& op) {
  const std::string basis = table.at("basis").get<std::string>();
  const nlohmann::json& factors = table.at("factors");
  const std::string key = op.at(basis == "op type" ? "op_type" : "name").get<std::string>();
  if (basis != "kind" && factors.contains(key)) return factors.at(key).get<double>();
  return table.at("other").get<double>();
}

/// Whether every stage of `moved` got, per FWD and BWD, its own ops' factors weighted by their
/// times (prints the first that did not), and whether any differs from `after`'s same stage.
bool factors_follow_ops(const nlohmann::json& after, const nlohmann::json& moved) {
  const nlohmann::json& costs = moved.at("instruction_costs");
  const nlohmann::json& tables = costs.at("op_factors");
  bool differs = false;
  for (const char* kind : {"FWD", "BWD"}) {
    if (!tables.contains(kind)) continue;
    const std::string time = std::string(kind) == "FWD" ? "fwd_ms" : "bwd_ms";
    const size_t stages = costs.at("stage_factors").size();
    for (size_t k = 0; k < stages; ++k) {
      double sum = 0, weighted = 0;
      for (const nlohmann::json& op : moved.at("ops")) {
        if (op.at("stage").get<size_t>() != k) continue;
        sum += op.at(time).get<double>();
        weighted += op_factor(tables.at(kind), op) * op.at(time).get<double>();
      }
      const double expected = sum > 0 ? weighted / sum : tables.at(kind).at("other").get<double>();
      const double got = costs.at("stage_factors").at(k).at(kind).get<double>();
      if (std::fabs(got - expected) > 1e-6 * expected) {
        std::printf(
            "FAIL: stage %zu of the plan with other cuts has %s factor %.6f; its ops' "
            "factors weighted by their times give %.6f\n",
            k, kind, got, expected);
        return false;
      }
      const nlohmann::json& before = after.at("instruction_costs").at("stage_factors");
      if (k < before.size() && before.at(k).contains(kind) &&
          std::fabs(before.at(k).at(kind).get<double>() - got) > 1e-9 * got)
        differs = true;
    }
  }
  if (!differs)
    std::printf(
        "FAIL: the plan with other cuts got the calibrated plan's stage factors back: "
        "its cuts moved no op between stages of different factors\n");
  return differs;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr,
                 "usage: %s BEFORE_PLAN_JSON AFTER_PLAN_JSON ACCURACY(0|1) [AFTER_DUMP_JSON "
                 "[MOVED_PLAN_JSON]]\n",
                 argv[0]);
    return 2;
  }
  try {
    const nlohmann::json before = read_json(argv[1]);
    const nlohmann::json after = read_json(argv[2]);
    const bool check = std::string(argv[3]) == "1";
    const nlohmann::json& costs = after.at("instruction_costs");
    const std::string after_source = costs.at("source").get<std::string>();
    const std::string before_source =
        before.at("instruction_costs").at("source").get<std::string>();
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
    // The runtime's step starts before its first instruction and ends after its last (the
    // barriers): what a step takes beyond them is more than nothing, and the plan charges it.
    const double overhead = costs.value("step_overhead_ms", 0.0);
    if (!(overhead > 0)) {
      std::printf("FAIL: the calibration's step_overhead_ms is %g, not above 0\n", overhead);
      return 1;
    }
    const double measured = costs.at("measured_step_ms").get<double>();
    const double uncalibrated = costs.at("uncalibrated_step_ms").get<double>();
    const double calibrated = after.at("predicted").at("step_ms").get<double>();
    const double predicted_before = before.at("predicted").at("step_ms").get<double>();
    std::printf(
        "trace median step %.3f ms; predicted before %.3f ms, calibrated %.3f ms "
        "(uncalibrated, same split %.3f ms)\n",
        measured, predicted_before, calibrated, uncalibrated);
    const double error = std::fabs(calibrated - measured);
    const double before_error = std::fabs(uncalibrated - measured);
    if (check && error > std::fmax(0.05 * measured, before_error)) {
      std::printf(
          "FAIL: calibrated prediction %.3f ms is %.1f%% off the measured %.3f ms "
          "(uncalibrated %.1f%%)\n",
          calibrated, 100 * error / measured, measured, 100 * before_error / measured);
      return 1;
    }
    if (argc >= 5 && read_json(argv[4]).at("instruction_costs") != costs) {
      std::printf("FAIL: stagedump --json's instruction_costs are not plan.json's\n");
      return 1;
    }
    if (argc == 6) {
      const nlohmann::json moved = read_json(argv[5]);
      if (moved.at("predicted").at("split_after") == after.at("predicted").at("split_after")) {
        std::printf("FAIL: the third plan has the second's cuts\n");
        return 1;
      }
      if (!factors_follow_ops(after, moved)) return 1;
      std::printf("the plan with other cuts gives each stage its own ops' factors\n");
    }
    std::printf("PASS\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}

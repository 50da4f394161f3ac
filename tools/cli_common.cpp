#include "tools/cli_common.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <optional>

#include "runtime/format/error.h"
#include "runtime/format/suggest.h"

#ifndef STAGECRAFT_VERSION
#error "STAGECRAFT_VERSION must be defined (tools/CMakeLists.txt passes PROJECT_VERSION)"
#endif

namespace stagecraft::cli {
namespace {

/// CLI11's text on one line, without a trailing period.
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  while (!text.empty() && (text.back() == ' ' || text.back() == '.')) text.pop_back();
  return text;
}

/// Every spelling of every option of `app` ("--devices", "-o", "--output"), for "did you mean".
std::vector<std::string> option_spellings(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  }
  return names;
}

/// "unknown option '--devcies' (did you mean '--devices'?)" or "unexpected argument 'x'", for the
/// first argument CLI11 could not place.
std::string extras_message(const CLI::App& app, const CLI::ParseError& error) {
  std::vector<std::string> extras = app.remaining();
  if (extras.empty()) return one_line(error.what());
  const std::string& first = extras.front();
  if (first.size() > 1 && first[0] == '-' && !std::isdigit(static_cast<unsigned char>(first[1]))) {
    const std::string flag = first.substr(0, first.find('='));
    std::vector<std::string> spellings = option_spellings(app);
    std::vector<std::string_view> known(spellings.begin(), spellings.end());
    return fmt::format("unknown option '{}'{}; see {} --help", flag, did_you_mean(flag, known),
                       app.get_name());
  }
  return fmt::format("unexpected argument '{}'; see {} --help", first, app.get_name());
}

/// "--lr: 'abc' is not a number" from CLI11's "Could not convert: --lr = abc".
std::string conversion_message(const CLI::App& app, const CLI::ParseError& error) {
  const std::string text = error.what();
  const std::string_view prefix = "Could not convert: ";
  const std::size_t equals = text.find(" = ");
  if (text.rfind(prefix, 0) != 0 || equals == std::string::npos) return one_line(text);
  const std::string name = text.substr(prefix.size(), equals - prefix.size());
  const std::string value = text.substr(equals + 3);
  std::string kind = "a valid value";
  try {
    const std::string type = app.get_option(name)->get_type_name();
    if (type.find("INT") != std::string::npos) kind = "an integer";
    if (type.find("FLOAT") != std::string::npos || type.find("NUMBER") != std::string::npos)
      kind = "a number";
  } catch (const CLI::OptionNotFound&) {
  }
  return fmt::format("{}: '{}' is not {}", name, value, kind);
}

/// "--devices needs a value" from CLI11's "--devices: 1 required INT:POSITIVE missing", and
/// "--devices is given 2 times; give it once" from "--devices: At Most 1 required but received 2".
std::string mismatch_message(const CLI::ParseError& error) {
  const std::string text = error.what();
  const std::size_t colon = text.find(": ");
  if (colon == std::string::npos) return one_line(text);
  const std::string name = text.substr(0, colon);
  if (text.ends_with(" missing")) return fmt::format("{} needs a value", name);
  const std::string_view received = " required but received ";
  const std::size_t at = text.find(received);
  if (text.compare(colon + 2, 10, "At Most 1 ") == 0 && at != std::string::npos)
    return fmt::format("{} is given {} times; give it once", name,
                       text.substr(at + received.size()));
  return one_line(text);
}

/// "--devices must be 1 or more, not 0" from CLI11's "--devices: must be 1 or more, not 0" (the
/// text of `integer_in`); other validators' text as it is.
std::string validation_message(const CLI::ParseError& error) {
  std::string text = one_line(error.what());
  const std::size_t colon = text.find(": ");
  if (colon != std::string::npos && text.compare(colon + 2, 5, "must ") == 0) text.erase(colon, 1);
  return text;
}

}  // namespace

std::string version_line(std::string_view tool) {
  return fmt::format("{} {}", tool, STAGECRAFT_VERSION);
}

void add_version_flag(CLI::App& app, std::string_view tool) {
  app.set_version_flag("--version", version_line(tool), "Print the version and exit");
}

std::string usage_message(const CLI::App& app, const CLI::ParseError& error) {
  if (dynamic_cast<const CLI::ExtrasError*>(&error)) return extras_message(app, error);
  if (dynamic_cast<const CLI::ConversionError*>(&error)) return conversion_message(app, error);
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&error)) return mismatch_message(error);
  if (dynamic_cast<const CLI::ValidationError*>(&error)) return validation_message(error);
  if (dynamic_cast<const CLI::RequiredError*>(&error))
    return fmt::format("{}; see {} --help", one_line(error.what()), app.get_name());
  return one_line(error.what());
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: printed on stdout, exit 0
  } catch (const CLI::ParseError& e) {
    throw Error(ErrorKind::kUsage, usage_message(app, e));
  }
  return std::nullopt;
}

CLI::Validator integer_in(int64_t min, int64_t max) {
  auto check = [min, max](std::string& text) -> std::string {
    int64_t value = 0;
    const char* end = text.data() + text.size();
    auto [stop, ec] = std::from_chars(text.data(), end, value);
    const bool too_large = ec == std::errc::result_out_of_range && text[0] != '-';
    const bool too_small = ec == std::errc::result_out_of_range && text[0] == '-';
    if (too_large || (ec == std::errc() && stop == end && value > max))
      return fmt::format("must be at most {}, not {}", max, text);
    if (!too_small && (ec != std::errc() || stop != end))
      return fmt::format("must be an integer, not '{}'", text);
    if (too_small || value < min) return fmt::format("must be {} or more, not {}", min, text);
    return "";
  };
  return CLI::Validator(check, min == 1 ? "POSITIVE" : fmt::format(">={}", min));
}

}  // namespace stagecraft::cli

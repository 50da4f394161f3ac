#include "passes/passes.h"

namespace stagecraft::passes {

std::unique_ptr<Pass> make_pass(std::string_view name) {
#define STAGECRAFT_PASS(cli_name, class_name, description) \
  if (name == cli_name) return std::make_unique<class_name>();
#include "passes/passes.def"
#undef STAGECRAFT_PASS
  return nullptr;
}

std::vector<std::string_view> pass_names() {
  return {
#define STAGECRAFT_PASS(cli_name, class_name, description) cli_name,
#include "passes/passes.def"
#undef STAGECRAFT_PASS
  };
}

}  // namespace stagecraft::passes

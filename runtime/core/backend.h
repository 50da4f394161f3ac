#pragma once
/// \file
/// A backend: the kernels of one kind of device, behind one dispatch table. The compiler asks
/// it which ops and dtypes it runs (`check`); the runtime asks it for kernels and per-device
/// contexts.

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "runtime/core/kernel.h"

namespace stagecraft::rt {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  /// "" when the backend runs `signature`, else the reason, e.g. "op 'Foo' has no cpu kernel".
  std::string check(const OpSignature& signature) const;

  /// The kernel for `op_type`; throws `Error(kUnsupported)` when there is none.
  KernelFn kernel(std::string_view op_type) const;

  /// The table entry for `op_type`; throws `Error(kUnsupported)` when there is none.
  const KernelEntry& entry(std::string_view op_type) const;

  /// The ops the backend has kernels for, in table order.
  virtual std::span<const KernelEntry> table() const = 0;

  /// A context for one device using `threads` CPU threads for its kernels.
  virtual std::unique_ptr<DeviceContext> make_device(int device, int threads) const = 0;

 protected:
  const KernelEntry* find(std::string_view op_type) const;
};

/// The CPU backend (oneDNN and plain C++; runtime/cpu).
const Backend& cpu_backend();

/// The backend named `name` ("cpu"); throws `Error(kUsage)` listing the names otherwise, and
/// `Error(kUnsupported)` for "cuda" in a build without it.
const Backend& backend_by_name(std::string_view name);

}  // namespace stagecraft::rt

// Error handling: an Error carries one line a user can act on; Expected<T> holds a T or an Error.
// No exceptions cross module boundaries; every fallible public function returns Expected/Status.
#pragma once
#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace ss {

struct Error {
  std::string message;
};

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}           // NOLINT: implicit by design
  Expected(Error err) : v_(std::move(err)) {}           // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { assert(!ok()); return std::get<1>(v_); }
  const std::string& message() const { return error().message; }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Expected<void> {
 public:
  Expected() = default;
  Expected(Error err) : err_(std::move(err)), ok_(false) {}  // NOLINT
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { assert(!ok_); return err_; }
  const std::string& message() const { return err_.message; }

 private:
  Error err_;
  bool ok_ = true;
};

using Status = Expected<void>;

inline Error make_error(std::string msg) { return Error{std::move(msg)}; }

}  // namespace ss

// Propagate an error from an Expected/Status expression.
#define SS_TRY(expr)                                      \
  do {                                                    \
    auto&& ss_try_r_ = (expr);                            \
    if (!ss_try_r_.ok()) return ss_try_r_.error();        \
  } while (0)

#define SS_CONCAT_INNER(a, b) a##b
#define SS_CONCAT(a, b) SS_CONCAT_INNER(a, b)
// SS_ASSIGN(auto x, f()) — declares x from an Expected or returns its error.
#define SS_ASSIGN(decl, expr) SS_ASSIGN_IMPL(SS_CONCAT(ss_assign_, __LINE__), decl, expr)
#define SS_ASSIGN_IMPL(tmp, decl, expr)         \
  auto tmp = (expr);                            \
  if (!tmp.ok()) return tmp.error();            \
  decl = std::move(tmp).value()

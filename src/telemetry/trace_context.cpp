#include <random>

#include "telemetry/telemetry.h"

namespace ss::telemetry {

namespace {

std::mt19937_64& rng() {
  thread_local std::mt19937_64 g([] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }());
  return g;
}

template <size_t N>
std::array<uint8_t, N> random_id() {
  std::array<uint8_t, N> id{};
  do {
    for (size_t i = 0; i < N; i += 8) {
      const uint64_t v = rng()();
      for (size_t k = 0; k < 8 && i + k < N; ++k) id[i + k] = static_cast<uint8_t>(v >> (8 * k));
    }
  } while (is_zero(id));
  return id;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is invalid in traceparent (W3C §3.2.2)
}

bool parse_hex(std::string_view s, std::span<uint8_t> out) {
  if (s.size() != out.size() * 2) return false;
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

}  // namespace

bool is_zero(std::span<const uint8_t> id) {
  for (uint8_t b : id)
    if (b != 0) return false;
  return true;
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

TraceId new_trace_id() { return random_id<16>(); }
SpanId new_span_id() { return random_id<8>(); }

std::optional<TraceContext> parse_traceparent(std::string_view tp, std::string_view tracestate) {
  // Surrounding whitespace is optional whitespace of the header field, not part of the value.
  while (!tp.empty() && (tp.front() == ' ' || tp.front() == '\t')) tp.remove_prefix(1);
  while (!tp.empty() && (tp.back() == ' ' || tp.back() == '\t')) tp.remove_suffix(1);
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters.
  if (tp.size() < 55) return std::nullopt;
  uint8_t version = 0;
  if (!parse_hex(tp.substr(0, 2), std::span<uint8_t>(&version, 1)) || version == 0xff) return std::nullopt;
  if (version == 0 && tp.size() != 55) return std::nullopt;
  // A later version may append fields, after a '-'.
  if (tp.size() > 55 && tp[55] != '-') return std::nullopt;
  if (tp[2] != '-' || tp[35] != '-' || tp[52] != '-') return std::nullopt;
  TraceContext c;
  if (!parse_hex(tp.substr(3, 32), c.trace_id) || !parse_hex(tp.substr(36, 16), c.span_id) ||
      !parse_hex(tp.substr(53, 2), std::span<uint8_t>(&c.flags, 1)))
    return std::nullopt;
  if (is_zero(c.trace_id) || is_zero(c.span_id)) return std::nullopt;
  if (tracestate.size() <= 512) c.tracestate = std::string(tracestate);
  return c;
}

std::string format_traceparent(const TraceId& trace, const SpanId& span, uint8_t flags) {
  return "00-" + to_hex(trace) + "-" + to_hex(span) + "-" + to_hex(std::span<const uint8_t>(&flags, 1));
}

bool sample(const TraceId& trace, double ratio, const std::optional<TraceContext>& parent) {
  if (parent) return parent->sampled();
  if (ratio >= 1.0) return true;
  if (!(ratio > 0.0)) return false;
  uint64_t v = 0;
  for (size_t i = 8; i < 16; ++i) v = (v << 8) | trace[i];
  const auto bound = static_cast<uint64_t>(ratio * 9223372036854775808.0);  // ratio * 2^63
  return (v >> 1) < bound;
}

ClockAnchor::ClockAnchor()
    : system_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()),
      steady_(SteadyClock::now()) {}

uint64_t ClockAnchor::unix_ns(SteadyClock::time_point t) const {
  const int64_t d = std::chrono::duration_cast<std::chrono::nanoseconds>(t - steady_).count();
  const int64_t ns = system_ns_ + d;
  return ns > 0 ? static_cast<uint64_t>(ns) : 0;
}

}  // namespace ss::telemetry

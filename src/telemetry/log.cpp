#include <cstdio>
#include <ctime>

#include "telemetry/telemetry.h"

namespace ss::telemetry {

const char* to_string(LogLevel l) {
  switch (l) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warn: return "warning";
    case LogLevel::Error: return "error";
  }
  return "info";
}

Expected<LogFormat> parse_log_format(std::string_view s) {
  if (s == "text") return LogFormat::Text;
  if (s == "json") return LogFormat::Json;
  return make_error("--log-format must be 'text' or 'json', got '" + std::string(s) + "'");
}

Logger& Logger::global() {
  static Logger l;
  return l;
}

namespace {

std::string rfc3339(std::chrono::system_clock::time_point now) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char b[96];
  std::snprintf(b, sizeof b, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us % 1000000));
  return b;
}

}  // namespace

std::string Logger::format_line(LogLevel level, std::string_view component, std::string_view message,
                                std::string_view request_id, std::string_view trace_id,
                                const nlohmann::ordered_json& fields, std::chrono::system_clock::time_point now) const {
  if (format_.load() == LogFormat::Json) {
    nlohmann::ordered_json j;
    j["timestamp"] = rfc3339(now);
    j["level"] = to_string(level);
    j["component"] = component;
    j["message"] = message;
    if (!request_id.empty()) j["request_id"] = request_id;
    if (!trace_id.empty()) j["trace_id"] = trace_id;
    if (fields.is_object())
      for (const auto& [k, v] : fields.items()) j[k] = v;
    // Invalid UTF-8 (a client's bytes in a path) is replaced, never a thrown error.
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  std::string s = "selfserve: ";
  if (level == LogLevel::Warn || level == LogLevel::Error) s += std::string(to_string(level)) + ": ";
  s += message;
  if (!request_id.empty()) s += " request_id=" + std::string(request_id);
  if (!trace_id.empty()) s += " trace_id=" + std::string(trace_id);
  if (fields.is_object())
    for (const auto& [k, v] : fields.items())
      s += " " + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  s += "\n";
  return s;
}

void Logger::log(LogLevel level, std::string_view component, std::string_view message, std::string_view request_id,
                 std::string_view trace_id, const nlohmann::ordered_json& fields) {
  const std::string line =
      format_line(level, component, message, request_id, trace_id, fields, std::chrono::system_clock::now());
  std::FILE* f = sink_.load();
  if (!f) f = stderr;
  std::lock_guard<std::mutex> lk(mu_);
  std::fwrite(line.data(), 1, line.size(), f);
  std::fflush(f);
}

void log_info(std::string_view component, std::string_view message) {
  Logger::global().log(LogLevel::Info, component, message);
}
void log_warn(std::string_view component, std::string_view message) {
  Logger::global().log(LogLevel::Warn, component, message);
}
void log_error(std::string_view component, std::string_view message) {
  Logger::global().log(LogLevel::Error, component, message);
}

}  // namespace ss::telemetry

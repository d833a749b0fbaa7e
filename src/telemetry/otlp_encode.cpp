// The protobuf wire format (https://protobuf.dev/programming-guides/encoding/) of the messages an
// OTLP/HTTP trace export needs. Field numbers from opentelemetry-proto v1 (collector/trace/v1,
// trace/v1, common/v1, resource/v1). Zero scalars and empty strings are left out, as proto3 does.
#include <cstring>

#include "telemetry/telemetry.h"

namespace ss::telemetry {

namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

class Writer {
 public:
  std::string& out() { return b_; }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      b_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    b_.push_back(static_cast<char>(v));
  }
  void tag(uint32_t field, WireType t) { varint((static_cast<uint64_t>(field) << 3) | t); }
  void bytes(uint32_t field, std::string_view s) {
    tag(field, kLen);
    varint(s.size());
    b_.append(s);
  }
  void string(uint32_t field, std::string_view s) {
    if (!s.empty()) bytes(field, s);
  }
  void id(uint32_t field, std::span<const uint8_t> id) {
    bytes(field, std::string_view(reinterpret_cast<const char*>(id.data()), id.size()));
  }
  void fixed64(uint32_t field, uint64_t v) {
    if (v == 0) return;
    tag(field, kFixed64);
    for (int i = 0; i < 8; ++i) b_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void fixed32(uint32_t field, uint32_t v) {
    if (v == 0) return;
    tag(field, kFixed32);
    for (int i = 0; i < 4; ++i) b_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void uint(uint32_t field, uint64_t v) {  // int64 / enum / bool
    if (v == 0) return;
    tag(field, kVarint);
    varint(v);
  }
  // A nested message, always written (an empty one still says "present").
  template <class F>
  void message(uint32_t field, F&& fill) {
    Writer w;
    fill(w);
    bytes(field, w.b_);
  }

 private:
  std::string b_;
};

// AnyValue: string 1, bool 2, int 3, double 4, array 5 (ArrayValue.values 1).
void any_value(Writer& w, const AttrValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) {
    w.bytes(1, *s);  // present even when empty: an empty string is a value
  } else if (const auto* i = std::get_if<int64_t>(&v)) {
    w.tag(3, kVarint);
    w.varint(static_cast<uint64_t>(*i));
  } else if (const auto* d = std::get_if<double>(&v)) {
    uint64_t bits = 0;
    static_assert(sizeof bits == sizeof *d);
    std::memcpy(&bits, d, sizeof bits);
    w.tag(4, kFixed64);
    for (int k = 0; k < 8; ++k) w.out().push_back(static_cast<char>(bits >> (8 * k)));
  } else if (const auto* b = std::get_if<bool>(&v)) {
    w.tag(2, kVarint);
    w.varint(*b ? 1 : 0);
  } else if (const auto* a = std::get_if<std::vector<std::string>>(&v)) {
    w.message(5, [&](Writer& arr) {
      for (const std::string& s : *a) arr.message(1, [&](Writer& e) { e.bytes(1, s); });
    });
  }
}

// KeyValue: key 1, value 2.
void attributes(Writer& w, uint32_t field, const std::vector<Attribute>& attrs) {
  for (const Attribute& a : attrs)
    w.message(field, [&](Writer& kv) {
      kv.string(1, a.key);
      kv.message(2, [&](Writer& v) { any_value(v, a.value); });
    });
}

// Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6, start 7, end 8,
// attributes 9, events 11 (time 1, name 2, attributes 3), status 15 (message 2, code 3), flags 16.
void span(Writer& w, const Span& s) {
  w.id(1, s.trace_id);
  w.id(2, s.span_id);
  w.string(3, s.trace_state);
  if (!is_zero(s.parent_span_id)) w.id(4, s.parent_span_id);
  w.string(5, s.name);
  w.uint(6, static_cast<uint64_t>(s.kind));
  w.fixed64(7, s.start_unix_ns);
  w.fixed64(8, s.end_unix_ns);
  attributes(w, 9, s.attributes);
  for (const SpanEvent& e : s.events)
    w.message(11, [&](Writer& ev) {
      ev.fixed64(1, e.time_unix_ns);
      ev.string(2, e.name);
      attributes(ev, 3, e.attributes);
    });
  if (s.status != SpanStatus::Unset || !s.status_message.empty())
    w.message(15, [&](Writer& st) {
      st.string(2, s.status_message);
      st.uint(3, static_cast<uint64_t>(s.status));
    });
  // Span.flags: the W3C trace flags in bits 0-7, and bits 8-9 saying whether the parent is remote
  // (OTLP 1.1: 0x100 "known", 0x200 "remote").
  w.fixed32(16, s.flags);
}

}  // namespace

// ExportTraceServiceRequest.resource_spans 1 → ResourceSpans{resource 1 {attributes 1},
// scope_spans 2} → ScopeSpans{scope 1 {name 1, version 2}, spans 2}.
std::string encode_export_request(const std::vector<Attribute>& resource, std::string_view scope_name,
                                  std::string_view scope_version, std::span<const Span> spans) {
  Writer w;
  w.message(1, [&](Writer& rs) {
    rs.message(1, [&](Writer& r) { attributes(r, 1, resource); });
    rs.message(2, [&](Writer& ss) {
      ss.message(1, [&](Writer& sc) {
        sc.string(1, scope_name);
        sc.string(2, scope_version);
      });
      for (const Span& s : spans) ss.message(2, [&](Writer& sp) { span(sp, s); });
    });
  });
  return std::move(w.out());
}

}  // namespace ss::telemetry

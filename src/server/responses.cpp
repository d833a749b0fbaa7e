#include "server/responses.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "server/json_fields.h"

namespace ss::server {

using namespace detail;

namespace {

// A logprobs entry's token: its piece, or vLLM's "token_id:<id>" with return_tokens_as_token_ids
// (pieces that are not whole characters cannot be told apart as text).
std::string lp_token(const GenerationRequest& g, const ModelInfo& m, int32_t id) {
  return g.return_tokens_as_token_ids ? "token_id:" + std::to_string(id) : token_str(m, id);
}

ojson bytes_of(const std::string& s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; echoed prompt tokens
// come first: the first with null logprobs (nothing precedes it), the others with prompt_lps (tokens
// 1 .. n-1) when given, else null.
ojson completion_logprobs(const GenerationRequest& g, const ModelInfo& m, const std::vector<TokenLogprob>& lps,
                          size_t text_offset, const std::vector<int32_t>* echo_ids,
                          const std::vector<TokenLogprob>* prompt_lps = nullptr) {
  ojson tokens = ojson::array(), lp = ojson::array(), top = ojson::array(), off = ojson::array();
  size_t pos = 0;
  auto add_offset = [&](int32_t id) {  // offsets count the text's bytes, whatever the token is shown as
    off.push_back(pos);
    pos += token_str(m, id).size();
  };
  auto add = [&](int32_t id, const TokenLogprob& t) {
    const std::string s = lp_token(g, m, id);
    tokens.push_back(s);
    lp.push_back(t.logprob);
    ojson d = ojson::object();
    for (const auto& [tid, v] : t.top) {
      const std::string ts = lp_token(g, m, tid);
      if (!d.contains(ts)) d[ts] = v;
    }
    if (!d.contains(s)) d[s] = t.logprob;  // the token itself is always listed (as vLLM does)
    top.push_back(std::move(d));
    add_offset(id);
  };
  if (echo_ids) {
    const bool scored = prompt_lps && prompt_lps->size() + 1 == echo_ids->size();
    for (size_t i = 0; i < echo_ids->size(); ++i) {
      const int32_t id = (*echo_ids)[i];
      if (scored && i > 0) {
        add(id, (*prompt_lps)[i - 1]);
        continue;
      }
      tokens.push_back(lp_token(g, m, id));
      lp.push_back(nullptr);
      top.push_back(nullptr);
      add_offset(id);
    }
  }
  pos = std::max(pos, text_offset);
  for (const TokenLogprob& t : lps) add(t.token, t);
  return ojson{{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", off}};
}

ojson chat_logprobs(const GenerationRequest& g, const ModelInfo& m, const std::vector<TokenLogprob>& lps) {
  ojson content = ojson::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = lp_token(g, m, t.token);
    ojson top = ojson::array();
    for (const auto& [id, v] : t.top) {
      const std::string ts = lp_token(g, m, id);
      top.push_back(ojson{{"token", ts}, {"logprob", v}, {"bytes", bytes_of(ts)}});
    }
    content.push_back(ojson{{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return ojson{{"content", content}};
}

}  // namespace

nlohmann::ordered_json usage_json(const Usage& u) {
  return ojson{{"prompt_tokens", u.prompt_tokens},
               {"completion_tokens", u.completion_tokens},
               {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return dump_json(json{{"error", err}});
}

std::string dump_json(const nlohmann::json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string sse_event(const std::string& payload) { return "data: " + payload + "\n\n"; }

Usage usage_of(const GenerationRequest& g, const std::vector<ChoiceOutput>& choices) {
  Usage u;
  for (const PromptInput& p : g.prompts) u.prompt_tokens += static_cast<int>(p.ids.size());
  for (const ChoiceOutput& c : choices) u.completion_tokens += c.completion_tokens;
  return u;
}

// The fields every response and chunk object shares.
static ojson envelope(const char* object, const std::string& id, int64_t created, const ModelInfo& m, ojson choices) {
  return ojson{{"id", id}, {"object", object}, {"created", created}, {"model", m.id}, {"choices", std::move(choices)}};
}

nlohmann::ordered_json completion_response(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                           int64_t created, const std::vector<ChoiceOutput>& choices) {
  ojson arr = ojson::array();
  for (const ChoiceOutput& c : choices) {
    const PromptInput& p = g.prompts[g.prompt_index(c.index)];
    ojson lp = nullptr;
    if (g.logprobs >= 0)
      lp = completion_logprobs(g, m, c.logprobs, g.echo ? p.text.size() : 0, g.echo ? &p.ids : nullptr, &c.prompt_logprobs);
    arr.push_back(ojson{{"index", c.index},
                        {"text", g.echo ? p.text + c.text : c.text},
                        {"logprobs", lp},
                        {"finish_reason", c.finish_reason},
                        {"stop_reason", c.stop_reason ? ojson(*c.stop_reason) : ojson(nullptr)}});
  }
  ojson out = envelope("text_completion", id, created, m, std::move(arr));
  out["usage"] = usage_json(usage_of(g, choices));
  return out;
}

namespace {
std::string tool_call_id() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  char buf[32];
  std::snprintf(buf, sizeof buf, "call_%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return buf;
}
ojson tool_call(const std::string& name, std::string arguments) {
  return ojson{{"id", tool_call_id()}, {"type", "function"}, {"function", {{"name", name}, {"arguments", std::move(arguments)}}}};
}
}  // namespace

ToolAnswer tool_answer(const GenerationRequest& g, const std::string& text) {
  using TC = GenerationRequest::ToolChoice;
  ToolAnswer a;
  a.content = text;
  if (g.tool_choice == TC::None) return a;
  if (g.tool_choice == TC::Auto) {
    chat::ParsedToolOutput p = chat::parse_tool_calls(g.tool_format, text);
    if (p.calls.empty()) return a;
    if (!g.parallel_tool_calls) p.calls.resize(1);  // as vLLM: the first call only
    for (chat::ParsedToolCall& c : p.calls) a.calls.push_back(tool_call(c.name, std::move(c.arguments)));
    a.called = true;
    a.content = std::move(p.content);
    return a;
  }
  if (json_max_depth(text) > kMaxJsonDepth) return a;  // (re-serialized below: recursion per level)
  const ojson v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return a;  // cut by max_tokens: not a whole call
  if (g.tool_choice == TC::Named) {
    a.calls.push_back(tool_call(g.tool_name, text));  // the arguments exactly as generated
  } else {
    if (!v.is_array()) return a;
    ojson calls = ojson::array();
    for (const ojson& c : v) {
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("parameters")) return a;
      calls.push_back(tool_call(c["name"].get<std::string>(), c["parameters"].dump()));
    }
    a.calls = std::move(calls);
  }
  a.called = true;
  a.content.clear();
  return a;
}

std::string tool_finish_reason(const GenerationRequest& g, const ToolAnswer& a, const std::string& finish_reason) {
  using TC = GenerationRequest::ToolChoice;
  const bool calls = a.called && (g.tool_choice == TC::Required || g.tool_choice == TC::Auto);
  return calls && finish_reason == "stop" ? "tool_calls" : finish_reason;
}

nlohmann::ordered_json chat_response(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                     int64_t created, const std::vector<ChoiceOutput>& choices) {
  ojson arr = ojson::array();
  for (const ChoiceOutput& c : choices) {
    ojson message = {{"role", "assistant"}, {"content", c.text}};
    std::string finish = c.finish_reason;
    if (g.tool_choice != GenerationRequest::ToolChoice::None) {
      ToolAnswer a = tool_answer(g, c.text);
      if (a.called) {
        message["content"] = a.content.empty() ? ojson(nullptr) : ojson(a.content);
        message["tool_calls"] = std::move(a.calls);
        finish = tool_finish_reason(g, a, finish);
      }
    }
    arr.push_back(ojson{{"index", c.index},
                        {"message", std::move(message)},
                        {"logprobs", g.logprobs >= 0 ? chat_logprobs(g, m, c.logprobs) : ojson(nullptr)},
                        {"finish_reason", finish},
                        {"stop_reason", c.stop_reason ? ojson(*c.stop_reason) : ojson(nullptr)}});
  }
  ojson out = envelope("chat.completion", id, created, m, std::move(arr));
  out["usage"] = usage_json(usage_of(g, choices));
  return out;
}

// One completions chunk: the choice's text, its logprobs object (or null) and finish reason.
static ojson text_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id, int64_t created,
                        int index, const std::string& text, ojson logprobs, const char* finish_reason) {
  ojson choice = {{"index", index},
                  {"text", text},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason", finish_reason ? ojson(finish_reason) : ojson(nullptr)}};
  ojson out = envelope("text_completion", id, created, m, ojson::array({choice}));
  if (g.include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::ordered_json completion_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                        int64_t created, int index, const std::string& text,
                                        const std::vector<TokenLogprob>* logprobs, size_t text_offset,
                                        const char* finish_reason) {
  return text_chunk(g, m, id, created, index, text,
                    logprobs ? completion_logprobs(g, m, *logprobs, text_offset, nullptr) : ojson(nullptr), finish_reason);
}

nlohmann::ordered_json completion_echo_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                             int64_t created, int index, const std::vector<TokenLogprob>* prompt_lps) {
  const PromptInput& p = g.prompts[g.prompt_index(index)];
  return text_chunk(g, m, id, created, index, p.text,
                    g.logprobs >= 0 ? completion_logprobs(g, m, {}, 0, &p.ids, prompt_lps) : ojson(nullptr), nullptr);
}

std::vector<TokenLogprob> prompt_token_logprobs(const std::vector<int32_t>& ids,
                                                const std::vector<engine::PromptLogprob>& lps) {
  std::vector<TokenLogprob> out;
  out.reserve(lps.size());
  for (size_t i = 0; i < lps.size() && i + 1 < ids.size(); ++i) out.push_back({ids[i + 1], lps[i].logprob, lps[i].top});
  return out;
}

// One chat chunk around `delta`.
static ojson delta_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id, int64_t created,
                         int index, ojson delta, const std::vector<TokenLogprob>* logprobs, const char* finish_reason) {
  ojson choice = {{"index", index},
                  {"delta", std::move(delta)},
                  {"logprobs", logprobs ? chat_logprobs(g, m, *logprobs) : ojson(nullptr)},
                  {"finish_reason", finish_reason ? ojson(finish_reason) : ojson(nullptr)}};
  ojson out = envelope("chat.completion.chunk", id, created, m, ojson::array({choice}));
  if (g.include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::ordered_json chat_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                  int64_t created, int index, const char* role, const std::string* content,
                                  const std::vector<TokenLogprob>* logprobs, const char* finish_reason) {
  ojson delta = ojson::object();
  if (role) delta["role"] = role;
  if (content) delta["content"] = *content;
  return delta_chunk(g, m, id, created, index, std::move(delta), logprobs, finish_reason);
}

nlohmann::ordered_json chat_tool_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                       int64_t created, int index, const std::string& text,
                                       const std::vector<TokenLogprob>* logprobs, const char* finish_reason,
                                       size_t streamed) {
  ojson delta = ojson::object();
  std::string finish = finish_reason ? finish_reason : "";
  ToolAnswer a = tool_answer(g, text);
  // What is left of the content (the text before the calls, or all of it) after what was streamed.
  const std::string rest = a.content.size() > streamed ? a.content.substr(streamed) : std::string();
  if (!rest.empty() || (!a.called && streamed == 0)) delta["content"] = rest;
  if (a.called) {
    for (size_t k = 0; k < a.calls.size(); ++k) a.calls[k]["index"] = k;  // a stream's calls carry their index
    delta["tool_calls"] = std::move(a.calls);
    finish = tool_finish_reason(g, a, finish);
  }
  return delta_chunk(g, m, id, created, index, std::move(delta), logprobs, finish_reason ? finish.c_str() : nullptr);
}

nlohmann::ordered_json usage_chunk(const GenerationRequest& g, const ModelInfo& m, const std::string& id,
                                   int64_t created, const Usage& u) {
  ojson out = envelope(g.endpoint == Endpoint::ChatCompletions ? "chat.completion.chunk" : "text_completion", id,
                       created, m, ojson::array());
  out["usage"] = usage_json(u);
  return out;
}

}  // namespace ss::server

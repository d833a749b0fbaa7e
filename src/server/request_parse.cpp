#include "server/request_parse.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "server/json_fields.h"
#include "server/structured_params.h"

namespace ss::server {

using namespace detail;

namespace detail {
// Only for the message of a body that failed to parse: where and why, without exceptions.
struct ErrorSax : nlohmann::json_sax<json> {
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
};

ApiResult<json> parse_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ErrorSax sax;
    (void)json::sax_parse(body.begin(), body.end(), &sax);
    return bad(sax.message.empty() ? std::string("invalid JSON") : "invalid JSON: " + sax.message, {}, "invalid_json");
  }
  if (!j.is_object()) return bad(std::string("the request body must be a JSON object, got ") + type_name(j));
  return j;
}
}  // namespace detail

namespace {

std::optional<ApiError> check_model(const Fields& f, const ModelInfo& m) {
  const json* j = f.get("model");
  if (!j) return std::nullopt;  // optional: one model is served
  if (!j->is_string()) return bad(std::string("'model' must be a string, got ") + type_name(*j), "model");
  const std::string& name = j->get_ref<const std::string&>();
  if (name.empty() || name == m.id) return std::nullopt;
  ApiError e;
  e.status = 404;
  e.message = "The model '" + name + "' does not exist; this server serves '" + m.id + "'.";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

std::optional<ApiError> check_ids(const std::vector<int32_t>& ids, const ModelInfo& m, const char* param) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= m.vocab_size)
      return bad("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                     " is outside the vocabulary [0, " + std::to_string(m.vocab_size) + ")",
                 param);
  return std::nullopt;
}

// A JSON array of integer token ids (each in int32 range; the vocabulary check comes later).
bool parse_id_array(const json& a, std::vector<int32_t>& out) {
  out.clear();
  out.reserve(a.size());
  for (const json& x : a) {
    int64_t v = 0;
    if (!Fields::parse_int(x, v)) return false;
    out.push_back(v < INT32_MIN || v > INT32_MAX ? -1 : static_cast<int32_t>(v));
  }
  return true;
}

std::vector<int32_t> encode_text(const tok::Tokenizer& tk, const std::string& text, bool add_special) {
  return tk.encode(text, add_special, /*parse_special=*/true);
}

// Messages -> rendered chat text -> ids. prompt_text receives the rendered text.
std::optional<ApiError> render_messages(const json& msgs, bool add_generation_prompt, const ModelInfo& m,
                                         std::vector<int32_t>& ids, std::string& text, std::string_view tools_json = {}) {
  const bool native_calls = chat::tool_format(m.chat_template) != chat::ToolFormat::None;
  if (!msgs.is_array()) return bad(std::string("'messages' must be an array, got ") + type_name(msgs), "messages");
  if (msgs.empty()) return bad("'messages' must contain at least one message", "messages");
  std::vector<chat::ChatMessage> conv;
  conv.reserve(msgs.size());
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& msg = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return bad(where + " must be an object, got " + type_name(msg), where);
    auto r = msg.find("role");
    if (r == msg.end() || !r->is_string()) return bad(where + ".role must be a string", where + ".role");
    std::string role = r->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad(where + ".role must be one of system, developer, user, assistant, tool; got '" + role + "'",
                 where + ".role");
    std::string content;
    std::vector<chat::ChatToolCall> calls;
    auto c = msg.find("content");
    // An assistant turn that called tools: in the template's own format when it has one, else as the
    // text tool_choice "required" generates, so the model sees what it asked for before the answers.
    if (auto tc = msg.find("tool_calls"); role == "assistant" && tc != msg.end() && !tc->is_null()) {
      if (!tc->is_array()) return bad(where + ".tool_calls must be an array", where + ".tool_calls");
      for (const json& call : *tc) {
        const json fn = call.is_object() ? call.value("function", json()) : json();
        if (!fn.is_object() || !fn.value("name", json()).is_string() || !fn.value("arguments", json()).is_string())
          return bad(where + ".tool_calls[]: each needs function.name and function.arguments (strings)", where + ".tool_calls");
        if (!json::accept(fn["arguments"].get_ref<const std::string&>()))
          return bad(where + ".tool_calls[]: function.arguments must be a JSON text", where + ".tool_calls");
        if (json_max_depth(fn["arguments"].get_ref<const std::string&>()) > kMaxJsonDepth)
          return bad(where + ".tool_calls[]: function.arguments nests deeper than " +
                         std::to_string(kMaxJsonDepth) + " levels",
                     where + ".tool_calls");
        calls.push_back({fn["name"].get<std::string>(), fn["arguments"].get<std::string>()});
      }
    }
    if (c == msg.end() || c->is_null()) {
      if (role != "assistant") return bad(where + ".content is required", where + ".content");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      for (size_t k = 0; k < c->size(); ++k) {
        const json& part = (*c)[k];
        const std::string pw = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return bad(pw + " must be an object", pw);
        auto t = part.find("type");
        if (t == part.end() || !t->is_string()) return bad(pw + ".type must be a string", pw + ".type");
        if (*t != "text") return bad(pw + ": only text content is supported, got type '" + t->get<std::string>() + "'", pw);
        auto tx = part.find("text");
        if (tx == part.end() || !tx->is_string()) return bad(pw + ".text must be a string", pw + ".text");
        if (k) content += "\n";
        content += tx->get<std::string>();
      }
    } else {
      return bad(where + ".content must be a string or an array of text parts, got " + type_name(*c),
                 where + ".content");
    }
    if (!calls.empty() && !native_calls) {
      ojson arr = ojson::array();
      for (const chat::ChatToolCall& k : calls)
        arr.push_back(ojson{{"name", k.name}, {"parameters", ojson::parse(k.arguments)}});
      content += content.empty() ? arr.dump() : "\n" + arr.dump();
      calls.clear();
    }
    conv.push_back({std::move(role), std::move(content), std::move(calls)});
  }
  const tok::Tokenizer& tk = *m.tokenizer;
  auto rendered = chat::render_chat(m.chat_template, conv, add_generation_prompt, &tk, {}, tools_json);
  if (!rendered.ok()) return bad("cannot apply the chat template: " + rendered.message(), "messages");
  text = std::move(rendered).value();
  // A template that already begins with the BOS text must not get a second BOS.
  bool add_special = tk.add_bos();
  if (tk.bos_id() >= 0 && text.rfind(std::string(tk.token_text(tk.bos_id())), 0) == 0) add_special = false;
  ids = encode_text(tk, text, add_special);
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& p, const ModelInfo& m, std::vector<PromptInput>& out) {
  const tok::Tokenizer& tk = *m.tokenizer;
  auto from_text = [&](const std::string& s) -> std::optional<ApiError> {
    if (s.empty()) return bad("the prompt is empty", "prompt");
    out.push_back({encode_text(tk, s, tk.add_bos()), s});
    if (out.back().ids.empty()) return bad("the prompt is empty after tokenization", "prompt");
    return std::nullopt;
  };
  auto from_ids = [&](const json& a) -> std::optional<ApiError> {
    PromptInput in;
    if (!parse_id_array(a, in.ids)) return bad("'prompt' token arrays must hold integers only", "prompt");
    if (in.ids.empty()) return bad("the prompt is empty", "prompt");
    if (auto e = check_ids(in.ids, m, "prompt")) return e;
    in.text = tk.decode(in.ids, false);
    out.push_back(std::move(in));
    return std::nullopt;
  };
  if (p.is_string()) return from_text(p.get_ref<const std::string&>());
  if (!p.is_array())
    return bad(std::string("'prompt' must be a string, an array of strings or an array of token ids; got ") +
                   type_name(p),
               "prompt");
  if (p.empty()) return bad("the prompt is empty", "prompt");
  const json& first = p.front();
  if (first.is_number()) return from_ids(p);
  if (p.size() > static_cast<size_t>(m.max_choices))
    return bad("at most " + std::to_string(m.max_choices) + " prompts per request, got " + std::to_string(p.size()),
               "prompt");
  for (const json& x : p) {
    std::optional<ApiError> e;
    if (x.is_string() && first.is_string()) e = from_text(x.get_ref<const std::string&>());
    else if (x.is_array() && first.is_array()) e = from_ids(x);
    else return bad("'prompt' arrays must hold only strings, only token ids, or only arrays of token ids", "prompt");
    if (e) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json* j, const ModelInfo& m, std::vector<std::string>& out) {
  if (!j) return std::nullopt;
  auto add = [&](const json& s) -> std::optional<ApiError> {
    if (!s.is_string()) return bad("'stop' must be a string or an array of strings", "stop");
    const std::string& v = s.get_ref<const std::string&>();
    if (v.size() > m.max_stop_bytes)
      return bad("stop strings are limited to " + std::to_string(m.max_stop_bytes) + " bytes", "stop");
    if (!v.empty()) out.push_back(v);
    return std::nullopt;
  };
  if (j->is_string()) return add(*j);
  if (!j->is_array()) return bad(std::string("'stop' must be a string or an array of strings, got ") + type_name(*j), "stop");
  if (j->size() > static_cast<size_t>(m.max_stop))
    return bad("at most " + std::to_string(m.max_stop) + " stop strings, got " + std::to_string(j->size()), "stop");
  for (const json& s : *j)
    if (auto e = add(s)) return e;
  return std::nullopt;
}

// {"<token id>": bias in [-100, 100], ...}: OpenAI's logit_bias. Keys are decimal token ids of the
// vocabulary; one id spelled twice ("7" and "07") is rejected rather than resolved by key order.
std::optional<ApiError> parse_logit_bias(const json& j, const ModelInfo& m, std::vector<std::pair<int32_t, float>>& out) {
  if (!j.is_object()) return bad(std::string("'logit_bias' must be an object, got ") + type_name(j), "logit_bias");
  std::map<int32_t, float> bias;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = 0;
    bool digits = !key.empty() && key.size() <= 10;  // 10 digits cannot overflow int64
    for (size_t i = 0; digits && i < key.size(); ++i) {
      if (key[i] < '0' || key[i] > '9') digits = false;
      else id = id * 10 + (key[i] - '0');
    }
    if (!digits) return bad("'logit_bias' keys must be token ids (decimal integers), got '" + key + "'", "logit_bias");
    if (id >= m.vocab_size)
      return bad("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                     std::to_string(m.vocab_size) + ")",
                 "logit_bias");
    const json& v = it.value();
    if (!v.is_number())
      return bad("'logit_bias' values must be numbers, got " + std::string(type_name(v)) + " for token " + key,
                 "logit_bias");
    const double b = v.get<double>();
    if (!std::isfinite(b) || b < -100.0 || b > 100.0)
      return bad("'logit_bias' values must be in [-100, 100], got " + num(b) + " for token " + key, "logit_bias");
    if (!bias.emplace(static_cast<int32_t>(id), static_cast<float>(b)).second)
      return bad("logit_bias names token " + std::to_string(id) + " twice", "logit_bias");
  }
  out.assign(bias.begin(), bias.end());
  return std::nullopt;
}

std::string context_message(const ModelInfo& m, size_t prompt, int64_t max_tokens, bool chat) {
  const char* what = chat ? "messages" : "prompt";
  if (max_tokens <= 0)
    return "This model's maximum context length is " + std::to_string(m.max_model_len) +
           " tokens. However, your " + what + " has " + std::to_string(prompt) +
           " tokens, which leaves no room for a completion. Please reduce the length of the " + what + ".";
  return "This model's maximum context length is " + std::to_string(m.max_model_len) +
         " tokens. However, you requested " + std::to_string(static_cast<int64_t>(prompt) + max_tokens) + " tokens (" +
         std::to_string(prompt) + " in the " + what + ", " + std::to_string(max_tokens) +
         " for the completion). Please reduce the length of the " + what + " or the completion.";
}

ApiResult<GenerationRequest> parse_generation_impl(Endpoint ep, std::string_view body, const ModelInfo& m) {
  const bool chat = ep == Endpoint::ChatCompletions;
  auto parsed = parse_object(body);
  if (!parsed.ok()) return parsed.error();
  const json& j = parsed.value();
  Fields f(j);
  if (auto e = check_model(f, m)) return *e;

  GenerationRequest g;
  g.endpoint = ep;
  // Sampling. OpenAI's ranges where the engine has none; top_k -1 means off (vLLM).
  f.number("temperature", g.sampling.temperature, 0.0, 100.0);
  f.number("top_p", g.sampling.top_p, 0.0, 1.0, /*lo_open=*/true);
  int top_k = 0;
  f.integer("top_k", top_k, -1, std::numeric_limits<int32_t>::max());
  g.sampling.top_k = top_k < 0 ? 0 : top_k;
  f.number("min_p", g.sampling.min_p, 0.0, 1.0);
  f.number("presence_penalty", g.sampling.presence_penalty, -2.0, 2.0);
  f.number("frequency_penalty", g.sampling.frequency_penalty, -2.0, 2.0);
  f.number("repetition_penalty", g.sampling.repetition_penalty, 0.0, 100.0, /*lo_open=*/true);
  if (const json* s = f.get("seed"); s && !f.failed()) {
    int64_t v = 0;
    if (s->is_number_unsigned()) g.seed = s->get<uint64_t>();
    else if (Fields::parse_int(*s, v)) g.seed = static_cast<uint64_t>(v);
    else f.fail(bad(std::string("'seed' must be an integer, got ") + type_name(*s), "seed"));
  }
  f.integer("n", g.n, 1, m.max_choices);
  if (const json* b = f.get("best_of"); b && !f.failed()) {
    int64_t v = 0;
    if (!Fields::parse_int(*b, v)) f.fail(bad(std::string("'best_of' must be an integer, got ") + type_name(*b), "best_of"));
    else if (v != g.n && v != 1) f.fail(bad("best_of other than n is not supported", "best_of", "unsupported_parameter"));
  }
  f.boolean("stream", g.stream);
  if (const json* so = f.get("stream_options"); so && !f.failed()) {
    if (!so->is_object()) {
      f.fail(bad(std::string("'stream_options' must be an object, got ") + type_name(*so), "stream_options"));
    } else {
      Fields sf(*so);
      sf.boolean("include_usage", g.include_usage);
      sf.boolean("continuous_usage_stats", g.continuous_usage_stats);
      sf.boolean("include_timeline", g.include_timeline);
      if (sf.failed()) f.fail(sf.error());
    }
  }
  f.boolean("include_timeline", g.include_timeline);
  f.boolean("ignore_eos", g.ignore_eos);
  f.boolean("return_tokens_as_token_ids", g.return_tokens_as_token_ids);
  f.integer("min_tokens", g.min_tokens, 0, std::numeric_limits<int32_t>::max());
  f.boolean("include_stop_str_in_output", g.include_stop_str_in_output);
  f.boolean("skip_special_tokens", g.skip_special_tokens);
  if (const json* sti = f.get("stop_token_ids"); sti && !f.failed()) {
    if (!sti->is_array() || !parse_id_array(*sti, g.stop_token_ids))
      f.fail(bad("'stop_token_ids' must be an array of integers", "stop_token_ids"));
    else if (auto e = check_ids(g.stop_token_ids, m, "stop_token_ids"))
      f.fail(*e);
  }
  if (!f.failed())
    if (auto e = parse_stop(f.get("stop"), m, g.stop)) f.fail(*e);
  if (const json* t = f.get("timeout"); t && !f.failed()) {
    if (!t->is_number() || !(t->get<double>() > 0) || !std::isfinite(t->get<double>()))
      f.fail(bad("'timeout' must be a positive number of seconds", "timeout"));
    else
      g.timeout_s = t->get<double>();
  }
  if (const json* cs = f.get("cache_salt"); cs && !f.failed()) {
    if (!cs->is_string() || cs->get_ref<const std::string&>().empty())
      f.fail(bad(std::string("'cache_salt' must be a non-empty string, got ") +
                     (cs->is_string() ? "an empty string" : type_name(*cs)),
                 "cache_salt"));
    else
      g.cache_salt = cs->get<std::string>();
  }
  if (const json* lb = f.get("logit_bias"); lb && !f.failed())
    if (auto e = parse_logit_bias(*lb, m, g.sampling.logit_bias)) f.fail(*e);
  if (!f.failed())
    if (auto e = parse_structured(f, body, m, g)) f.fail(*e);

  // Lengths and logprobs differ between the two endpoints.
  int64_t max_tokens = -1;
  bool have_max = false;
  const char* max_param = "max_tokens";
  auto read_max = [&](const char* name) {
    if (!f.has(name) || f.failed()) return;
    f.integer(name, max_tokens, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    if (f.failed()) return;
    have_max = true;
    max_param = name;
    if (max_tokens < 1) f.fail(bad(std::string("'") + name + "' must be at least 1, got " + std::to_string(max_tokens), name));
  };
  if (chat) {
    read_max("max_completion_tokens");
    if (!have_max) read_max("max_tokens");
    bool want = false;
    f.boolean("logprobs", want);
    int top = -1;
    f.integer("top_logprobs", top, 0, m.max_logprobs);
    if (!f.failed() && top >= 0 && !want)
      f.fail(bad("'top_logprobs' requires 'logprobs': true", "top_logprobs"));
    if (want) g.logprobs = std::max(top, 0);
  } else {
    read_max("max_tokens");
    if (const json* lp = f.get("logprobs"); lp && !f.failed()) {
      f.integer("logprobs", g.logprobs, 0, m.max_logprobs);
    }
    f.boolean("echo", g.echo);
    if (const json* sx = f.get("suffix"); sx && !f.failed()) {
      if (!sx->is_string()) f.fail(bad("'suffix' must be a string", "suffix"));
      else if (!sx->get_ref<const std::string&>().empty())
        f.fail(bad("suffix is not supported", "suffix", "unsupported_parameter"));
    }
  }
  if (f.failed()) return f.error();

  // The prompt(s).
  if (chat) {
    auto it = j.find("messages");
    if (it == j.end() || it->is_null()) return bad("'messages' is required", "messages");
    bool add_gen = true;
    f.boolean("add_generation_prompt", add_gen);
    if (f.failed()) return f.error();
    PromptInput in;
    if (auto e = render_messages(*it, add_gen, m, in.ids, in.text, g.tools_json)) return *e;
    if (in.ids.empty()) return bad("the prompt is empty", "messages");
    if (auto e = check_ids(in.ids, m, "messages")) return *e;
    g.prompts.push_back(std::move(in));
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) return bad("'prompt' is required", "prompt");
    if (auto e = parse_prompt(*it, m, g.prompts)) return *e;
  }
  if (g.num_choices() > m.max_choices)
    return bad("prompts x n must be at most " + std::to_string(m.max_choices) + ", got " +
                   std::to_string(g.num_choices()),
               "n");

  // Context: never truncate; say what does not fit.
  size_t longest = 0;
  for (const PromptInput& p : g.prompts) longest = std::max(longest, p.ids.size());
  const char* prompt_param = chat ? "messages" : "prompt";
  if (static_cast<int64_t>(longest) >= m.max_model_len)
    return bad(context_message(m, longest, 0, chat), prompt_param, "context_length_exceeded");
  const int64_t room = m.max_model_len - static_cast<int64_t>(longest);
  if (have_max) {
    if (max_tokens > room) return bad(context_message(m, longest, max_tokens, chat), max_param, "context_length_exceeded");
    g.max_tokens = static_cast<int>(max_tokens);
  } else {
    // OpenAI's defaults: 16 for completions, the rest of the context for chat.
    g.max_tokens = static_cast<int>(chat ? room : std::min<int64_t>(16, room));
  }
  if (g.min_tokens > g.max_tokens)
    return bad("'min_tokens' (" + std::to_string(g.min_tokens) + ") must not exceed max_tokens (" +
                   std::to_string(g.max_tokens) + ")",
               "min_tokens");
  if (auto st = g.sampling.validate(); !st.ok()) return bad(st.message());
  return g;
}

}  // namespace

ApiResult<GenerationRequest> parse_generation_request(Endpoint ep, std::string_view body, const ModelInfo& m) {
  // The parser avoids exceptions by construction; this is the last line so that a library surprise
  // becomes a 400, never a crash of the server.
  try {
    return parse_generation_impl(ep, body, m);
  } catch (const std::bad_alloc&) {
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    e.message = "out of memory while parsing the request";
    return e;
  } catch (const std::exception& ex) {
    return bad(std::string("invalid request: ") + ex.what());
  }
}

engine::Request to_engine_request(const GenerationRequest& g, int choice, const ModelInfo& m, uint64_t default_seed) {
  engine::Request r;
  const int p = g.prompt_index(choice);
  const int sample = choice % g.n;
  r.prompt = g.prompts[p].ids;
  r.sampling = g.sampling;
  r.sampling.seed = (g.seed ? *g.seed : default_seed) + static_cast<uint64_t>(sample);
  r.max_tokens = g.max_tokens;
  r.min_tokens = g.min_tokens;
  r.stop_ids = g.stop_token_ids;
  if (!g.ignore_eos)
    for (int32_t id : m.tokenizer->eog_ids())
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) == r.stop_ids.end()) r.stop_ids.push_back(id);
  r.logprobs = g.logprobs;
  // Completions' echo + logprobs scores the prompt too (OpenAI's legacy semantics, vLLM's too).
  if (g.echo && g.logprobs >= 0) r.prompt_logprobs = g.logprobs;
  r.cache_salt = g.cache_salt;
  if (g.grammar) r.constraint = std::make_shared<structured::GrammarConstraint>(g.grammar, r.stop_ids);
  return r;
}

ApiResult<nlohmann::json> tokenize_request(std::string_view body, const ModelInfo& m) {
  try {
    auto parsed = parse_object(body);
    if (!parsed.ok()) return parsed.error();
    const json& j = parsed.value();
    Fields f(j);
    if (auto e = check_model(f, m)) return *e;
    bool add_special = true, add_gen = true, strs = false;
    f.boolean("add_special_tokens", add_special);
    f.boolean("add_generation_prompt", add_gen);
    f.boolean("return_token_strs", strs);
    if (f.failed()) return f.error();
    std::vector<int32_t> ids;
    if (const json* msgs = f.get("messages")) {
      std::string text, tools_json;
      if (const json* t = f.get("tools")) {  // as vLLM's /tokenize: the prompt a chat request with them gets
        if (!t->is_array()) return bad(std::string("'tools' must be an array, got ") + type_name(*t), "tools");
        OrderedSubtree sax({"tools"});
        if (!ojson::sax_parse(body, &sax) || !sax.result || sax.too_many_keys || sax.too_deep)
          return bad(sax.too_deep ? "'tools' nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"
                                  : "'tools': an object has more than " + std::to_string(kMaxSchemaKeys) + " keys",
                     "tools");
        tools_json = sax.result->dump();
      }
      if (auto e = render_messages(*msgs, add_gen, m, ids, text, tools_json)) return *e;
    } else if (const json* p = f.get("prompt")) {
      if (!p->is_string()) return bad(std::string("'prompt' must be a string, got ") + type_name(*p), "prompt");
      ids = m.tokenizer->encode(p->get_ref<const std::string&>(), add_special && m.tokenizer->add_bos(), true);
    } else {
      return bad("'prompt' or 'messages' is required", "prompt");
    }
    json out = {{"count", ids.size()}, {"max_model_len", m.max_model_len}, {"tokens", json(tokens_json(ids))}};
    if (strs) {
      json a = json::array();
      for (int32_t id : ids) a.push_back(token_str(m, id));
      out["token_strs"] = a;
    }
    return out;
  } catch (const std::exception& ex) {
    return bad(std::string("invalid request: ") + ex.what());
  }
}

ApiResult<nlohmann::json> detokenize_request(std::string_view body, const ModelInfo& m) {
  try {
    auto parsed = parse_object(body);
    if (!parsed.ok()) return parsed.error();
    const json& j = parsed.value();
    Fields f(j);
    if (auto e = check_model(f, m)) return *e;
    const json* t = f.get("tokens");
    if (!t) return bad("'tokens' is required", "tokens");
    std::vector<int32_t> ids;
    if (!t->is_array() || !parse_id_array(*t, ids)) return bad("'tokens' must be an array of integers", "tokens");
    if (auto e = check_ids(ids, m, "tokens")) return *e;
    return json{{"prompt", m.tokenizer->decode(ids, false)}};
  } catch (const std::exception& ex) {
    return bad(std::string("invalid request: ") + ex.what());
  }
}

nlohmann::json models_response(const ModelInfo& m) {
  json model = {{"id", m.id},           {"object", "model"},     {"created", m.created},
                {"owned_by", "selfserve"}, {"root", m.id},         {"max_model_len", m.max_model_len}};
  return json{{"object", "list"}, {"data", json::array({model})}};
}

}  // namespace ss::server

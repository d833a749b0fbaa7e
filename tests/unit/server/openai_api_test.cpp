// The pure JSON -> Request conversion: every bad input is a 4xx with an OpenAI-style error naming
// the field; good inputs become the right engine requests; responses have the OpenAI shapes.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include "test_util.h"

using namespace ss;
using namespace ss::server;
using nlohmann::json;

namespace {

class OpenAiApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tok_ = test_support::test_tokenizer().release(); }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(tok_, nullptr);
    m_.id = "test-model";
    m_.max_model_len = 128;
    m_.vocab_size = tok_->vocab_size();
    m_.tokenizer = tok_;
    m_.chat_template = tok_->chat_template();
  }
  ApiResult<GenerationRequest> completion(const std::string& body) {
    return parse_generation_request(Endpoint::Completions, body, m_);
  }
  ApiResult<GenerationRequest> chat(const std::string& body) {
    return parse_generation_request(Endpoint::ChatCompletions, body, m_);
  }
  // Expects a rejection with `status` naming `param` (when given).
  void expect_error(const ApiResult<GenerationRequest>& r, int status, const std::string& param, const std::string& body) {
    ASSERT_FALSE(r.ok()) << "accepted: " << body;
    EXPECT_EQ(r.error().status, status) << body << " -> " << r.error().message;
    if (!param.empty()) {
      EXPECT_EQ(r.error().param, param) << body << " -> " << r.error().message;
    }
    EXPECT_FALSE(r.error().message.empty());
  }
  static tok::Tokenizer* tok_;
  ModelInfo m_;
};
tok::Tokenizer* OpenAiApi::tok_ = nullptr;

TEST_F(OpenAiApi, MinimalCompletion) {
  auto r = completion(R"({"model":"test-model","prompt":"Hello world"})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GenerationRequest& g = r.value();
  ASSERT_EQ(g.prompts.size(), 1u);
  EXPECT_EQ(g.prompts[0].ids, tok_->encode("Hello world", tok_->add_bos(), true));
  EXPECT_EQ(g.prompts[0].text, "Hello world");
  EXPECT_EQ(g.max_tokens, 16);  // OpenAI's completions default
  EXPECT_EQ(g.n, 1);
  EXPECT_FALSE(g.stream);
  EXPECT_EQ(g.logprobs, -1);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 1.0f);
}

TEST_F(OpenAiApi, ModelIsOptionalAndNullMeansDefault) {
  auto r = completion(R"({"prompt":"hi","temperature":null,"max_tokens":null,"stop":null,"seed":null,"n":null})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().max_tokens, 16);
}

TEST_F(OpenAiApi, UnknownFieldsAreIgnored) {
  auto r = completion(
      R"({"prompt":"hi","user":"u1","metadata":{"a":[1,2,{"b":null}]},"store":false,"x_future_flag":true,
          "tools":[{"type":"function"}],"parallel_tool_calls":false,"service_tier":"auto"})");
  ASSERT_TRUE(r.ok()) << r.error().message;
}

TEST_F(OpenAiApi, AllSamplingFields) {
  auto r = completion(R"({"prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,
      "seed":7,"presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,"stop":["a","b"],
      "stop_token_ids":[5,6],"n":3,"logprobs":2,"echo":true,"stream":true,"stream_options":{"include_usage":true},
      "timeout":2.5,"ignore_eos":true})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GenerationRequest& g = r.value();
  EXPECT_EQ(g.max_tokens, 5);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.9f);
  EXPECT_EQ(g.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(g.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(g.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(g.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(g.seed, 7u);
  EXPECT_EQ(g.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(g.stop_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(g.n, 3);
  EXPECT_EQ(g.num_choices(), 3);
  EXPECT_EQ(g.logprobs, 2);
  EXPECT_TRUE(g.echo);
  EXPECT_TRUE(g.stream);
  EXPECT_TRUE(g.include_usage);
  EXPECT_TRUE(g.ignore_eos);
  ASSERT_TRUE(g.timeout_s.has_value());
  EXPECT_DOUBLE_EQ(*g.timeout_s, 2.5);
}

TEST_F(OpenAiApi, TopKMinusOneMeansOff) {
  auto r = completion(R"({"prompt":"hi","top_k":-1})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().sampling.top_k, 0);
}

TEST_F(OpenAiApi, LogitBias) {
  // OpenAI's form: token ids as string keys; integers and floats alike.
  auto r = completion(R"({"prompt":"hi","logit_bias":{"7":-100,"5":10.5,"0":0}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<std::pair<int32_t, float>> want = {{0, 0.0f}, {5, 10.5f}, {7, -100.0f}};
  EXPECT_EQ(r.value().sampling.logit_bias, want);
  EXPECT_EQ(to_engine_request(r.value(), 0, m_, 1).sampling.logit_bias, want);
  const std::string last = std::to_string(m_.vocab_size - 1);
  auto edge = completion(R"({"prompt":"hi","logit_bias":{")" + last + R"(":100}})");
  ASSERT_TRUE(edge.ok()) << edge.error().message;
  auto beyond = completion(R"({"prompt":"hi","logit_bias":{")" + std::to_string(m_.vocab_size) + R"(":1}})");
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.error().param, "logit_bias");
  for (const char* body : {R"({"prompt":"hi","logit_bias":{}})", R"({"prompt":"hi","logit_bias":null})"}) {
    auto e = completion(body);
    ASSERT_TRUE(e.ok()) << body;
    EXPECT_TRUE(e.value().sampling.logit_bias.empty());
  }
}

TEST_F(OpenAiApi, StopAsString) {
  auto r = completion(R"({"prompt":"hi","stop":"\n\n"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().stop, std::vector<std::string>{"\n\n"});
}

TEST_F(OpenAiApi, MalformedBodies) {
  for (const char* body : {"", "{", "{\"prompt\": }", "not json", "{\"prompt\":\"hi\",}", "{\"prompt\":\"\xff\xfe\"}",
                           "{\"a\":1}{\"b\":2}", "nul", "\"\\ud800\""}) {
    auto r = completion(body);
    expect_error(r, 400, "", body);
  }
  for (const char* body : {"[]", "\"x\"", "1", "null", "true", "[{\"prompt\":\"hi\"}]"}) {
    auto r = completion(body);
    expect_error(r, 400, "", body);
    EXPECT_NE(r.error().message.find("JSON object"), std::string::npos) << r.error().message;
  }
}

TEST_F(OpenAiApi, WrongTypesAreRejectedNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt":"hi","top_k":2.5})", "top_k"},
      {R"({"prompt":"hi","top_k":40.0})", "top_k"},
      {R"({"prompt":"hi","top_k":"5"})", "top_k"},
      {R"({"prompt":"hi","top_k":true})", "top_k"},
      {R"({"prompt":"hi","temperature":"hot"})", "temperature"},
      {R"({"prompt":"hi","temperature":[1]})", "temperature"},
      {R"({"prompt":"hi","top_p":"x"})", "top_p"},
      {R"({"prompt":"hi","min_p":{}})", "min_p"},
      {R"({"prompt":"hi","presence_penalty":"a"})", "presence_penalty"},
      {R"({"prompt":"hi","frequency_penalty":false})", "frequency_penalty"},
      {R"({"prompt":"hi","repetition_penalty":"1"})", "repetition_penalty"},
      {R"({"prompt":"hi","n":1.5})", "n"},
      {R"({"prompt":"hi","n":"2"})", "n"},
      {R"({"prompt":"hi","seed":1.5})", "seed"},
      {R"({"prompt":"hi","seed":"7"})", "seed"},
      {R"({"prompt":"hi","max_tokens":"10"})", "max_tokens"},
      {R"({"prompt":"hi","max_tokens":10.0})", "max_tokens"},
      {R"({"prompt":"hi","stream":"yes"})", "stream"},
      {R"({"prompt":"hi","stream":1})", "stream"},
      {R"({"prompt":"hi","stream_options":"x"})", "stream_options"},
      {R"({"prompt":"hi","stream":true,"stream_options":{"include_usage":"y"}})", "include_usage"},
      {R"({"prompt":"hi","stop":5})", "stop"},
      {R"({"prompt":"hi","stop":[1]})", "stop"},
      {R"({"prompt":"hi","stop":{"a":1}})", "stop"},
      {R"({"prompt":"hi","stop_token_ids":"x"})", "stop_token_ids"},
      {R"({"prompt":"hi","stop_token_ids":[1.5]})", "stop_token_ids"},
      {R"({"prompt":"hi","logprobs":true})", "logprobs"},
      {R"({"prompt":"hi","logprobs":2.5})", "logprobs"},
      {R"({"prompt":"hi","echo":1})", "echo"},
      {R"({"prompt":"hi","ignore_eos":"no"})", "ignore_eos"},
      {R"({"prompt":"hi","timeout":"x"})", "timeout"},
      {R"({"prompt":"hi","model":5})", "model"},
      {R"({"prompt":"hi","logit_bias":[1]})", "logit_bias"},
      {R"({"prompt":"hi","cache_salt":5})", "cache_salt"},
      {R"({"prompt":"hi","min_tokens":1.5})", "min_tokens"},
      {R"({"prompt":"hi","include_stop_str_in_output":"yes"})", "include_stop_str_in_output"},
      {R"({"prompt":"hi","cache_salt":""})", "cache_salt"},
      {R"({"prompt":"hi","best_of":1.5})", "best_of"},
      {R"({"prompt":"hi","suffix":3})", "suffix"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":{"text":"hi"}})", "prompt"},
      {R"({"prompt":true})", "prompt"},
      {R"({"prompt":[1.5,2]})", "prompt"},
      {R"({"prompt":[1,"a"]})", "prompt"},
      {R"({"prompt":["a",1]})", "prompt"},
      {R"({"prompt":[[1],"a"]})", "prompt"},
      {R"({"prompt":[[1,2],[3,"x"]]})", "prompt"},
      {R"({"prompt":[null]})", "prompt"},
  };
  for (const auto& [body, param] : cases) expect_error(completion(body), 400, param, body);
}

TEST_F(OpenAiApi, OutOfRangeValues) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt":"hi","temperature":-1})", "temperature"},
      {R"({"prompt":"hi","temperature":1e300})", "temperature"},
      {R"({"prompt":"hi","top_p":0})", "top_p"},
      {R"({"prompt":"hi","top_p":1.5})", "top_p"},
      {R"({"prompt":"hi","top_k":-2})", "top_k"},
      {R"({"prompt":"hi","top_k":99999999999})", "top_k"},
      {R"({"prompt":"hi","min_p":2})", "min_p"},
      {R"({"prompt":"hi","presence_penalty":3})", "presence_penalty"},
      {R"({"prompt":"hi","frequency_penalty":-2.5})", "frequency_penalty"},
      {R"({"prompt":"hi","repetition_penalty":0})", "repetition_penalty"},
      {R"({"prompt":"hi","n":0})", "n"},
      {R"({"prompt":"hi","n":1000})", "n"},
      {R"({"prompt":"hi","n":-1})", "n"},
      {R"({"prompt":"hi","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"hi","max_tokens":-5})", "max_tokens"},
      {R"({"prompt":"hi","logprobs":21})", "logprobs"},
      {R"({"prompt":"hi","logprobs":-1})", "logprobs"},
      {R"({"prompt":"hi","timeout":0})", "timeout"},
      {R"({"prompt":"hi","timeout":-3})", "timeout"},
      {R"({"prompt":"hi","stop_token_ids":[-1]})", "stop_token_ids"},
      {R"({"prompt":"hi","stop_token_ids":[99999999]})", "stop_token_ids"},
      {R"({"prompt":"hi","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})", "stop"},
      {R"({"prompt":"hi","best_of":3})", "best_of"},
      {R"({"prompt":"hi","logit_bias":{"5":101}})", "logit_bias"},
      {R"({"prompt":"hi","min_tokens":-1})", "min_tokens"},
      {R"({"prompt":"hi","max_tokens":4,"min_tokens":5})", "min_tokens"},
      {R"({"prompt":"hi","min_tokens":17})", "min_tokens"},
      {R"({"prompt":"hi","logit_bias":{"5":-100.5}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"5":"10"}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"5":[1]}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"-1":1}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"1.5":1}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"abc":1}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{" 5":1}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"":1}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"99999999":1}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"99999999999999999999":1}})", "logit_bias"},
      {R"({"prompt":"hi","logit_bias":{"5":1,"005":2}})", "logit_bias"},
      {R"({"prompt":"hi","suffix":"tail"})", "suffix"},
      {R"({"prompt":"hi","response_format":{"type":"yaml"}})", "response_format"},
      {R"({"prompt":"hi","response_format":{"type":"json_schema"}})", "response_format"},
      {R"({"prompt":"hi","response_format":{"type":"json_schema","json_schema":{"name":"x"}}})", "response_format"},
      {R"({"prompt":"hi","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"x(?=a)b"}}}})",
       "response_format"},
      {R"({"prompt":"hi","guided_json":"{not json"})", "guided_json"},
      {R"({"prompt":"hi","guided_json":5})", "guided_json"},
      {R"({"prompt":"hi","guided_json":{"type":"object"},"response_format":{"type":"json_object"}})", "guided_json"},
      {R"({"prompt":"hi","guided_choice":[]})", "guided_choice"},
      {R"({"prompt":"hi","guided_choice":["a",1]})", "guided_choice"},
      {R"({"prompt":"hi","guided_regex":5})", "guided_regex"},
      {R"({"prompt":"hi","guided_regex":"a(b"})", "guided_regex"},
      {R"({"prompt":"hi","guided_regex":"(a)\\1"})", "guided_regex"},
      {R"({"prompt":"hi","guided_regex":"a+","guided_choice":["a"]})", "guided_regex"},
      {R"({"prompt":"hi","guided_grammar":"root ::= item"})", "guided_grammar"},
      {R"({"prompt":"hi","grammar":5})", "grammar"},
      {R"({"prompt":"hi","grammar":"root ::= root \"a\""})", "grammar"},
      {R"({"prompt":"hi","grammar":"root ::= \"a\"","guided_regex":"a"})", "guided_regex"},
      {R"({"prompt":"hi","structured_outputs":{"grammar":"x ::= \"a\""}})", "structured_outputs.grammar"},
      {R"({"prompt":"hi","json_schema":{"type":"number","multipleOf":2}})", "json_schema"},
      {R"({"prompt":"hi","structured_outputs":"a+"})", "structured_outputs"},
      {R"({"prompt":"hi","structured_outputs":{}})", "structured_outputs"},
      {R"({"prompt":"hi","structured_outputs":{"json_object":false}})", "structured_outputs"},
      {R"({"prompt":"hi","structured_outputs":{"regex":"a+","choice":["a"]}})", "structured_outputs.regex"},
      {R"({"prompt":"hi","structured_outputs":{"regex":["a"]}})", "structured_outputs.regex"},
      {R"({"prompt":"hi","structured_outputs":{"json":7}})", "structured_outputs.json"},
      {R"({"prompt":"hi","structured_outputs":{"json_object":"yes"}})", "structured_outputs.json_object"},
      {R"({"prompt":"hi","structured_outputs":{"choice":[]}})", "structured_outputs.choice"},
      {R"({"prompt":"hi","structured_outputs":{"structural_tag":"{}"}})", "structured_outputs.structural_tag"},
      {R"({"prompt":"hi","structured_outputs":{"json_object":true,"disable_any_whitespace":"yes"}})",
       "structured_outputs.disable_any_whitespace"},
      {R"({"prompt":"hi","structured_outputs":{"regex":"a","disable_fallback":1}})", "structured_outputs.disable_fallback"},
      {R"({"prompt":"hi","structured_outputs":{"regex":"a"},"response_format":{"type":"json_object"}})",
       "structured_outputs.regex"},
      {R"({"prompt":[-1]})", "prompt"},
      {R"({"prompt":[99999999]})", "prompt"},
      {R"({"prompt":[4294967297]})", "prompt"},
  };
  for (const auto& [body, param] : cases) expect_error(completion(body), 400, param, body);
}

TEST_F(OpenAiApi, ToolChoiceRequiredAndNamedBecomeGrammarsAndToolCalls) {
  // A ChatML template without a tool format: tools stay out of the prompt, calls are written as JSON.
  m_.chat_template =
      "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  auto matches = [](const structured::Grammar& g, std::string_view text) { return g.matches(text); };
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  // Declared order "zeta" before "alpha" (the body is parsed into sorted maps; the tools are re-read).
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"}},"required":["zeta","alpha"],"additionalProperties":false}}},)"
      R"({"type":"function","function":{"name":"g"}}])";
  auto named = chat("{" + msgs + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})");
  ASSERT_TRUE(named.ok()) << named.error().message;
  const GenerationRequest& n = named.value();
  EXPECT_EQ(n.tool_choice, GenerationRequest::ToolChoice::Named);
  EXPECT_TRUE(matches(n.grammar->grammar(), R"({"zeta":1,"alpha":true})"));
  EXPECT_FALSE(matches(n.grammar->grammar(), R"({"alpha":true,"zeta":1})"));
  EXPECT_FALSE(matches(n.grammar->grammar(), R"({"zeta": 1,"alpha":true})"));
  auto calls = tool_answer(n, R"({"zeta":1,"alpha":true})");
  ASSERT_TRUE(calls.called);
  ASSERT_EQ(calls.calls.size(), 1u);
  EXPECT_EQ(calls.calls[0]["function"]["name"], "f");
  EXPECT_EQ(calls.calls[0]["function"]["arguments"], R"({"zeta":1,"alpha":true})");
  EXPECT_EQ(calls.content, "");
  EXPECT_EQ(tool_finish_reason(n, calls, "stop"), "stop");
  EXPECT_FALSE(tool_answer(n, R"({"zeta":1,)").called);  // cut by max_tokens: no call
  EXPECT_EQ(tool_answer(n, R"({"zeta":1,)").content, R"({"zeta":1,)");

  for (bool parallel : {true, false}) {
    auto req = chat("{" + msgs + "," + tools + R"(,"tool_choice":"required","parallel_tool_calls":)" +
                    (parallel ? "true" : "false") + "}");
    ASSERT_TRUE(req.ok()) << req.error().message;
    const GenerationRequest& r = req.value();
    EXPECT_EQ(r.tool_choice, GenerationRequest::ToolChoice::Required);
    const std::string one = R"([{"name":"g","parameters":{}}])";
    const std::string two = R"([{"name":"f","parameters":{"zeta":2,"alpha":false}},{"name":"g","parameters":{}}])";
    EXPECT_TRUE(matches(r.grammar->grammar(), one));
    EXPECT_EQ(matches(r.grammar->grammar(), two), parallel);
    // Compact: no blanks a small model would pad the call with.
    EXPECT_FALSE(matches(r.grammar->grammar(), R"([ {"name":"g","parameters":{}}])"));
    EXPECT_FALSE(matches(r.grammar->grammar(), R"([{"name": "g","parameters":{}}])"));
    EXPECT_FALSE(matches(r.grammar->grammar(), R"([{"name":"h","parameters":{}}])"));
    EXPECT_FALSE(matches(r.grammar->grammar(), R"([{"name":"g","parameters":{"x":1}}])"));
    EXPECT_FALSE(matches(r.grammar->grammar(), "[]"));
    auto c2 = tool_answer(r, two);
    ASSERT_TRUE(c2.called);
    ASSERT_EQ(c2.calls.size(), 2u);
    EXPECT_EQ(c2.calls[0]["function"]["arguments"], R"({"zeta":2,"alpha":false})");
    EXPECT_NE(c2.calls[0]["id"], c2.calls[1]["id"]);
    EXPECT_EQ(tool_finish_reason(r, c2, "stop"), "tool_calls");
    EXPECT_EQ(tool_finish_reason(r, c2, "length"), "length");
    EXPECT_EQ(tool_finish_reason(r, tool_answer(r, "[{"), "stop"), "stop");
  }
  // "none" ignores the tools; completions ignore them altogether.
  auto none = chat("{" + msgs + "," + tools + R"(,"tool_choice":"none"})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value().grammar);
  EXPECT_EQ(none.value().tool_choice, GenerationRequest::ToolChoice::None);
  // An assistant turn with tool calls and the tool's answer render into the prompt.
  auto turn = chat(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"g","arguments":"{\"a\": 1}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]})");
  ASSERT_TRUE(turn.ok()) << turn.error().message;
  EXPECT_NE(turn.value().prompts[0].text.find(R"([{"name":"g","parameters":{"a":1}}])"), std::string::npos)
      << turn.value().prompts[0].text;
  EXPECT_NE(turn.value().prompts[0].text.find("sunny"), std::string::npos);

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{" + msgs + "," + tools + "}", "tool_choice"},  // "auto" by default: this template has no call format
      {"{" + msgs + "," + tools + R"(,"tool_choice":"auto"})", "tool_choice"},
      {"{" + msgs + "," + tools + R"(,"tool_choice":"maybe"})", "tool_choice"},
      {"{" + msgs + "," + tools + R"(,"tool_choice":{"type":"function","function":{"name":"h"}}})", "tool_choice"},
      {"{" + msgs + "," + tools + R"(,"tool_choice":{"type":"function"}})", "tool_choice"},
      {"{" + msgs + R"(,"tool_choice":"required"})", "tool_choice"},
      {"{" + msgs + R"(,"tools":[],"tool_choice":"required"})", "tools"},
      {"{" + msgs + R"(,"tools":{"type":"function"},"tool_choice":"required"})", "tools"},
      {"{" + msgs + R"(,"tools":[{"type":"custom","custom":{"name":"x"}}],"tool_choice":"required"})", "tools"},
      {"{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"a b"}}],"tool_choice":"required"})", "tools"},
      {"{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"a"}}],"tool_choice":"required"})",
       "tools"},
      {"{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"a","parameters":[]}}],"tool_choice":"required"})", "tools"},
      {"{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"a","parameters":{"type":"number","multipleOf":2}}}],"tool_choice":"required"})",
       "tool_choice"},
      {"{" + msgs + "," + tools + R"(,"tool_choice":"required","parallel_tool_calls":1})", "parallel_tool_calls"},
      {"{" + msgs + "," + tools + R"(,"tool_choice":"required","response_format":{"type":"json_object"}})", "response_format"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"g","arguments":"{nope"}}]}]})",
       "messages[0].tool_calls"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":{"a":1}}]})", "messages[0].tool_calls"},
      {R"({"messages":[{"role":"tool"}]})", "messages[0].content"},
  };
  for (const auto& [body, param] : cases) expect_error(chat(body), 400, param, body);
}

// tool_choice "auto" with a template that has a call format: the tools go into the prompt as the
// template writes them, nothing constrains the text, and the calls are parsed out of the answer.
TEST_F(OpenAiApi, ToolChoiceAutoUsesTheTemplatesFormat) {
  const nlohmann::ordered_json fixtures = nlohmann::ordered_json::parse(
      test_support::read_file(std::string(SS_SOURCE_DIR) + "/tests/data/tokenizer/chat_tool_cases.json"));
  m_.chat_template = fixtures["templates"]["qwen2.5"].get<std::string>();
  m_.max_model_len = 4096;
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"}}}}}])";
  auto r = chat(R"({"messages":[{"role":"user","content":"hi"}],)" + tools + "}");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GenerationRequest& g = r.value();
  EXPECT_EQ(g.tool_choice, GenerationRequest::ToolChoice::Auto);
  EXPECT_EQ(g.tool_format, chat::ToolFormat::Hermes);
  EXPECT_FALSE(g.grammar);
  // Python's json.dumps of the tool, in its declared key order.
  EXPECT_NE(g.prompts[0].text.find(
                "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
                "\"properties\": {\"zeta\": {\"type\": \"integer\"}, \"alpha\": {\"type\": \"boolean\"}}}}}\n</tools>"),
            std::string::npos)
      << g.prompts[0].text;
  // "none" leaves the tools out of the prompt.
  auto none = chat(R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":"none",)" + tools + "}");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none.value().prompts[0].text.find("<tools>"), std::string::npos);

  // Text and calls, as the model wrote them.
  const std::string text = "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"zeta\": 1}}\n</tool_call>";
  ToolAnswer a = tool_answer(g, text);
  ASSERT_TRUE(a.called);
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0]["function"]["name"], "f");
  EXPECT_EQ(a.calls[0]["function"]["arguments"], "{\"zeta\": 1}");
  EXPECT_EQ(a.content, "Checking.\n");
  EXPECT_EQ(tool_finish_reason(g, a, "stop"), "tool_calls");
  const std::string two_calls = text + "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"zeta\": 2}}\n</tool_call>";
  EXPECT_EQ(tool_answer(g, two_calls).calls.size(), 2u);
  auto single = chat(R"({"messages":[{"role":"user","content":"hi"}],"parallel_tool_calls":false,)" + tools + "}");
  ASSERT_TRUE(single.ok()) << single.error().message;
  ASSERT_EQ(tool_answer(single.value(), two_calls).calls.size(), 1u) << "parallel_tool_calls false: the first call";
  EXPECT_EQ(tool_answer(single.value(), two_calls).calls[0]["function"]["arguments"], "{\"zeta\": 1}");
  ToolAnswer plain = tool_answer(g, "Just text.");
  EXPECT_FALSE(plain.called);
  EXPECT_EQ(plain.content, "Just text.");
  EXPECT_EQ(tool_finish_reason(g, plain, "stop"), "stop");

  ChoiceOutput o;
  o.text = text;
  o.finish_reason = "stop";
  const json resp = chat_response(g, m_, "chatcmpl-1", 1, {o});
  EXPECT_EQ(resp["choices"][0]["message"]["content"], "Checking.\n");
  EXPECT_EQ(resp["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(resp["choices"][0]["finish_reason"], "tool_calls");
  // Streaming: "Check" already went out; the last chunk carries the rest of the content and the call.
  const json last = chat_tool_chunk(g, m_, "chatcmpl-1", 1, 0, text, nullptr, "stop", 5);
  EXPECT_EQ(last["choices"][0]["delta"]["content"], "ing.\n");
  EXPECT_EQ(last["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "tool_calls");
  const json all_sent = chat_tool_chunk(g, m_, "chatcmpl-1", 1, 0, "Just text.", nullptr, "stop", 10);
  EXPECT_FALSE(all_sent["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(all_sent["choices"][0]["finish_reason"], "stop");

  // History: an assistant's calls in the template's <tool_call> form, results as <tool_response>.
  auto turn = chat(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"zeta\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}],)" +
                   tools + "}");
  ASSERT_TRUE(turn.ok()) << turn.error().message;
  EXPECT_NE(turn.value().prompts[0].text.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                                              "{\"zeta\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
                                              "sunny\n</tool_response><|im_end|>"),
            std::string::npos)
      << turn.value().prompts[0].text;

  // Llama 3.2: calls are JSON objects; two calls in one turn are the template's own error.
  m_.chat_template = fixtures["templates"]["llama3.2"].get<std::string>();
  auto l = chat(R"({"messages":[{"role":"user","content":"hi"}],)" + tools + "}");
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(l.value().tool_format, chat::ToolFormat::Llama3Json);
  EXPECT_NE(l.value().prompts[0].text.find("Given the following functions"), std::string::npos);
  ToolAnswer la = tool_answer(l.value(), R"({"name": "f", "parameters": {"alpha": true}})");
  ASSERT_TRUE(la.called);
  EXPECT_EQ(la.calls[0]["function"]["arguments"], "{\"alpha\": true}");
  auto two = chat(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}},{"function":{"name":"f","arguments":"{}"}}]}]})");
  expect_error(two, 400, "messages", "two calls in a Llama 3.2 turn");
}

// What gets serialized, compiled or printed may not nest past kMaxJsonDepth: those steps recurse
// per level, and a 200,000-deep array in a schema's unknown key crashed the server. Unknown fields
// may nest as they like (the body parser does not recurse).
TEST_F(OpenAiApi, DeeplyNestedSchemasAndToolsAreRefused) {
  auto nest = [](size_t n) { return std::string(n, '[') + std::string(n, ']'); };
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  const size_t most = kMaxJsonDepth;
  // The schema object is one level: a key inside it may nest most - 1 more.
  auto ok = chat("{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","x":)" +
                 nest(most - 1) + "}}}}");
  EXPECT_TRUE(ok.ok()) << ok.error().message;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","x":)" +
           nest(most) + "}}}}",
       "response_format"},
      {"{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","x":)" +
           nest(200000) + "}}}}",
       "response_format"},
      {"{" + msgs + R"(,"guided_json":")" + std::string(200000, '[') + "\"}", "guided_json"},
      {"{" + msgs + R"(,"tools":[{"type":"function","function":{"name":"f","x":)" + nest(200000) + "}}]}", "tools"},
      {"{" + msgs + R"(,"tool_choice":"required","tools":[{"type":"function","function":{"name":"f","x":)" +
           nest(200000) + "}}]}",
       "tools"},
      {R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"g","arguments":")" +
           nest(200000) + R"("}}]}]})",
       "messages[0].tool_calls"},
  };
  for (const auto& [body, param] : cases) {
    auto r = chat(body);
    expect_error(r, 400, param, body.substr(0, 160));
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("deeper"), std::string::npos) << r.error().message;
    }
  }
  auto t = tokenize_request("{" + msgs + R"(,"tools":[{"x":)" + nest(5000) + "}]}", m_);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().status, 400);
  EXPECT_TRUE(chat("{" + msgs + R"(,"metadata":)" + nest(200000) + "}").ok()) << "an unknown deep field is ignored";
}

TEST_F(OpenAiApi, StructuredOutputsKeepTheSchemasPropertyOrder) {
  // The request is parsed into std::map objects; the schema is read again with its key order, so
  // "zeta" (declared first) must come first even though it sorts last.
  auto matches = [](const structured::Grammar& g, std::string_view text) { return g.matches(text); };
  const std::string schema =
      R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"boolean"}},"required":["zeta","alpha"]})";
  for (const std::string& body :
       {R"({"prompt":"hi","response_format":{"type":"json_schema","json_schema":{"name":"t","schema":)" + schema + "}}}",
        R"({"prompt":"hi","guided_json":)" + schema + "}",
        R"({"prompt":"hi","guided_json":)" + nlohmann::json(schema).dump() + "}"}) {  // a schema as a string
    auto r = completion(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().message;
    ASSERT_TRUE(r.value().grammar) << body;
    EXPECT_TRUE(matches(r.value().grammar->grammar(), R"({"zeta":1,"alpha":true})")) << body;
    EXPECT_FALSE(matches(r.value().grammar->grammar(), R"({"alpha":true,"zeta":1})")) << body;
    // Each choice gets its own constraint over the shared compiled grammar.
    engine::Request er = to_engine_request(r.value(), 0, m_, 1);
    EXPECT_TRUE(er.constraint) << body;
  }
  // vLLM's structured_outputs (v0.12 on) and guided_regex: the same grammars.
  for (const std::string& body :
       {R"({"prompt":"hi","structured_outputs":{"json":)" + schema + "}}",
        R"({"prompt":"hi","structured_outputs":{"json":)" + nlohmann::json(schema).dump() + ",\"disable_fallback\":true}}"}) {
    auto r = completion(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().message;
    EXPECT_TRUE(matches(r.value().grammar->grammar(), R"({"zeta":1,"alpha":true})")) << body;
    EXPECT_FALSE(matches(r.value().grammar->grammar(), R"({"alpha":true,"zeta":1})")) << body;
  }
  for (const std::string& body : {std::string(R"({"prompt":"hi","guided_regex":"[0-9]{3}-[a-z]+"})"),
                                  std::string(R"({"prompt":"hi","structured_outputs":{"regex":"[0-9]{3}-[a-z]+","json":null}})")}) {
    auto r = completion(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().message;
    EXPECT_TRUE(matches(r.value().grammar->grammar(), "123-abc")) << body;
    EXPECT_FALSE(matches(r.value().grammar->grammar(), "12-abc")) << body;
  }
  // GBNF: llama.cpp's grammar field, vLLM's structured_outputs.grammar and guided_grammar; llama.cpp's
  // json_schema field.
  const std::string gbnf = nlohmann::json("root ::= answer (\",\" answer)*\nanswer ::= \"yes\" | \"no\"").dump();
  for (const std::string& body : {R"({"prompt":"hi","grammar":)" + gbnf + "}", R"({"prompt":"hi","guided_grammar":)" + gbnf + "}",
                                  R"({"prompt":"hi","structured_outputs":{"grammar":)" + gbnf + "}}"}) {
    auto r = completion(body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.error().message;
    EXPECT_TRUE(matches(r.value().grammar->grammar(), "yes,no,no")) << body;
    EXPECT_FALSE(matches(r.value().grammar->grammar(), "yes,")) << body;
  }
  auto none = completion(R"({"prompt":"hi","grammar":""})");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value().grammar);
  auto ljs = completion(R"({"prompt":"hi","json_schema":)" + schema + "}");
  ASSERT_TRUE(ljs.ok()) << ljs.error().message;
  EXPECT_TRUE(matches(ljs.value().grammar->grammar(), R"({"zeta":1,"alpha":true})"));
  EXPECT_FALSE(matches(ljs.value().grammar->grammar(), R"({"alpha":true,"zeta":1})"));
  // vLLM's disable_any_whitespace: the same values, no blanks.
  auto compact = completion(R"({"prompt":"hi","structured_outputs":{"json":)" + schema + R"(,"disable_any_whitespace":true}})");
  ASSERT_TRUE(compact.ok()) << compact.error().message;
  EXPECT_TRUE(matches(compact.value().grammar->grammar(), R"({"zeta":1,"alpha":true})"));
  EXPECT_FALSE(matches(compact.value().grammar->grammar(), R"({"zeta": 1, "alpha": true})"));
  auto spaced = completion(R"({"prompt":"hi","structured_outputs":{"json":)" + schema + R"(,"disable_any_whitespace":false}})");
  ASSERT_TRUE(spaced.ok());
  EXPECT_TRUE(matches(spaced.value().grammar->grammar(), R"({"zeta": 1, "alpha": true})"));
  auto so_choice = completion(R"({"prompt":"hi","structured_outputs":{"choice":["up","down"]}})");
  ASSERT_TRUE(so_choice.ok());
  EXPECT_TRUE(matches(so_choice.value().grammar->grammar(), "down"));
  EXPECT_FALSE(matches(so_choice.value().grammar->grammar(), "left"));
  auto so_obj = completion(R"({"prompt":"hi","structured_outputs":{"json_object":true}})");
  ASSERT_TRUE(so_obj.ok());
  EXPECT_TRUE(matches(so_obj.value().grammar->grammar(), R"({"a": 1})"));
  auto choice = completion(R"({"prompt":"hi","guided_choice":["yes","no"]})");
  ASSERT_TRUE(choice.ok());
  EXPECT_TRUE(matches(choice.value().grammar->grammar(), "no"));
  EXPECT_FALSE(matches(choice.value().grammar->grammar(), "maybe"));
  auto obj = chat(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})");
  ASSERT_TRUE(obj.ok());
  EXPECT_TRUE(matches(obj.value().grammar->grammar(), R"({"a": [1, 2]})"));
  auto text = chat(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"text"}})");
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(text.value().grammar);
}

TEST_F(OpenAiApi, RequestsWithTheSameSchemaShareOneCompiledGrammar) {
  m_.grammar_cache = std::make_shared<structured::GrammarCache>(2);
  auto body = [](const std::string& schema) { return R"({"prompt":"hi","guided_json":)" + schema + "}"; };
  const std::string a = R"({"type":"object","properties":{"x":{"type":"integer"}}})";
  const std::string b = R"({"type":"array"})", c = R"({"type":"string"})";
  auto ra = completion(body(a)), ra2 = completion(body(a));
  // Same schema through response_format: the same grammar too (the key is the schema, not the field).
  auto ra3 = completion(R"({"prompt":"hi","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":)" + a + "}}}");
  ASSERT_TRUE(ra.ok() && ra2.ok() && ra3.ok());
  EXPECT_EQ(ra.value().grammar, ra2.value().grammar);
  EXPECT_EQ(ra.value().grammar, ra3.value().grammar);
  // Key order is part of the schema (it is the generation order): another order, another grammar.
  auto rswap = completion(body(R"({"properties":{"x":{"type":"integer"}},"type":"object"})"));
  ASSERT_TRUE(rswap.ok());
  EXPECT_NE(ra.value().grammar, rswap.value().grammar);
  // Capacity 2, least recently used out: a is evicted by b and c.
  auto rb = completion(body(b)), rc = completion(body(c));
  ASSERT_TRUE(rb.ok() && rc.ok());
  EXPECT_EQ(m_.grammar_cache->size(), 2u);
  EXPECT_NE(completion(body(a)).value().grammar, ra.value().grammar);
  EXPECT_EQ(completion(body(c)).value().grammar, rc.value().grammar);
  m_.grammar_cache.reset();
}

TEST_F(OpenAiApi, StructuredOutputSchemaWithTooManyKeysIsRefused) {
  // ordered_json inserts in linear time; an object with thousands of keys would make the re-read
  // quadratic, so it is a 400 instead.
  std::string props;
  for (int i = 0; i < 3000; ++i) {
    if (i) props += ',';
    props.append("\"k").append(std::to_string(i)).append("\":{}");
  }
  const std::string body = R"({"prompt":"hi","guided_json":{"type":"object","properties":{)" + props + "}}}";
  expect_error(completion(body), 400, "guided_json", "3000 properties");
  // Other fields of the body may be as large as they like: only the schema is read again.
  std::string big;
  for (int i = 0; i < 3000; ++i) {
    if (i) big += ',';
    big.append("\"x").append(std::to_string(i)).append("\":1");
  }
  auto ok = completion(R"({"prompt":"hi","extra":{)" + big + R"(},"guided_json":{"type":"integer"}})");
  EXPECT_TRUE(ok.ok()) << ok.error().message;
}

TEST_F(OpenAiApi, EmptyPrompts) {
  for (const char* body : {R"({"prompt":""})", R"({"prompt":[]})", R"({"prompt":[[]]})", R"({"prompt":["a",""]})",
                           R"({})", R"({"prompt":null})"})
    expect_error(completion(body), 400, "prompt", body);
  for (const char* body : {R"({"messages":[]})", R"({})", R"({"messages":null})"})
    expect_error(chat(body), 400, "messages", body);
}

TEST_F(OpenAiApi, UnknownModelIs404) {
  auto r = completion(R"({"model":"gpt-4","prompt":"hi"})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, 404);
  EXPECT_EQ(r.error().code, "model_not_found");
  EXPECT_EQ(r.error().param, "model");
  auto c = chat(R"({"model":"nope","messages":[{"role":"user","content":"x"}]})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().status, 404);
}

TEST_F(OpenAiApi, ContextIsNeverTruncated) {
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += " word" + std::to_string(i);
  auto r = completion(json{{"prompt", long_text}}.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, 400);
  EXPECT_EQ(r.error().code, "context_length_exceeded");
  EXPECT_NE(r.error().message.find("maximum context length is 128"), std::string::npos) << r.error().message;

  std::vector<int> ids(100, 5);
  auto fits = completion(json{{"prompt", ids}, {"max_tokens", 28}}.dump());
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  EXPECT_EQ(fits.value().max_tokens, 28);
  auto over = completion(json{{"prompt", ids}, {"max_tokens", 29}}.dump());
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, "context_length_exceeded");
  EXPECT_EQ(over.error().param, "max_tokens");
  EXPECT_NE(over.error().message.find("129"), std::string::npos) << over.error().message;
  auto huge = completion(R"({"prompt":"hi","max_tokens":1000000000000000})");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code, "context_length_exceeded");
  auto exact = completion(json{{"prompt", std::vector<int>(128, 5)}}.dump());
  ASSERT_FALSE(exact.ok()) << "a prompt filling the context leaves no room";
  // Near the end of the context the default max_tokens shrinks to what is left.
  auto tail = completion(json{{"prompt", std::vector<int>(120, 5)}}.dump());
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail.value().max_tokens, 8);
}

TEST_F(OpenAiApi, TokenAndBatchPrompts) {
  auto r = completion(R"({"prompt":[1,2,3],"n":2})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.value().num_choices(), 2);
  auto b = completion(R"({"prompt":["one","two"],"n":2})");
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b.value().prompts.size(), 2u);
  EXPECT_EQ(b.value().num_choices(), 4);
  EXPECT_EQ(b.value().prompt_index(3), 1);
  auto t = completion(R"({"prompt":[[1,2],[3]]})");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t.value().prompts[1].ids, std::vector<int32_t>{3});
  m_.max_choices = 4;
  expect_error(completion(R"({"prompt":["a","b","c"],"n":2})"), 400, "n", "6 choices");
}

TEST_F(OpenAiApi, Chat) {
  auto r = chat(R"({"model":"test-model","messages":[{"role":"system","content":"Be brief."},
      {"role":"user","content":"Hi"}],"max_completion_tokens":7,"max_tokens":99,"logprobs":true,"top_logprobs":3})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const GenerationRequest& g = r.value();
  EXPECT_EQ(g.max_tokens, 7) << "max_completion_tokens wins";
  EXPECT_EQ(g.logprobs, 3);
  const std::string& text = g.prompts[0].text;
  EXPECT_NE(text.find("<|im_start|>system\nBe brief.<|im_end|>"), std::string::npos) << text;
  EXPECT_NE(text.find("<|im_start|>assistant\n"), std::string::npos) << text;
  EXPECT_EQ(g.prompts[0].ids, tok_->encode(text, false, true));

  auto d = chat(R"({"messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value().max_tokens, 128 - static_cast<int>(d.value().prompts[0].ids.size())) << "chat default: the rest";
  EXPECT_EQ(d.value().logprobs, -1);

  auto parts = chat(R"({"messages":[{"role":"developer","content":"sys"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null},{"role":"user","content":"c","name":"bob"}]})");
  ASSERT_TRUE(parts.ok()) << parts.error().message;
  EXPECT_NE(parts.value().prompts[0].text.find("a\nb"), std::string::npos);
  auto lp = chat(R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true})");
  ASSERT_TRUE(lp.ok());
  EXPECT_EQ(lp.value().logprobs, 0);
}

TEST_F(OpenAiApi, BadChatMessages) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":{"role":"user"}})", "messages"},
      {R"({"messages":[1]})", "messages[0]"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":5,"content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", "messages[0].content[0]"},
      {R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", "messages[0].content[0].text"},
      {R"({"messages":[{"role":"user","content":[5]}]})", "messages[0].content[0]"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2.5})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0})", "max_completion_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", "max_tokens"},
      {R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"yes"})", "add_generation_prompt"},
  };
  for (const auto& [body, param] : cases) expect_error(chat(body), 400, param, body);
}

TEST_F(OpenAiApi, DeepNestingIsRejectedNotACrash) {
  const int depth = 200000;
  std::string body = "{\"prompt\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
  expect_error(completion(body), 400, "", "deep");
  std::string obj = "{\"prompt\":\"hi\",\"x\":";
  for (int i = 0; i < depth; ++i) obj += "{\"a\":";
  obj += "1" + std::string(depth, '}') + "}";
  EXPECT_TRUE(completion(obj).ok()) << "an unknown deep field is ignored";
}

TEST_F(OpenAiApi, ToEngineRequest) {
  auto r = completion(R"({"prompt":"hi","n":3,"seed":100,"stop_token_ids":[7],"logprobs":1,"max_tokens":4})");
  ASSERT_TRUE(r.ok());
  for (int c = 0; c < 3; ++c) {
    engine::Request er = to_engine_request(r.value(), c, m_, 555);
    EXPECT_EQ(er.sampling.seed, 100u + c);
    EXPECT_EQ(er.max_tokens, 4);
    EXPECT_EQ(er.logprobs, 1);
    EXPECT_EQ(er.prompt, r.value().prompts[0].ids);
    EXPECT_EQ(er.stop_ids.front(), 7);
    for (int32_t id : tok_->eog_ids())
      EXPECT_NE(std::find(er.stop_ids.begin(), er.stop_ids.end(), id), er.stop_ids.end());
  }
  EXPECT_EQ(to_engine_request(r.value(), 0, m_, 1).cache_salt, "");
  EXPECT_EQ(to_engine_request(r.value(), 0, m_, 1).prompt_logprobs, -1) << "logprobs without echo";
  for (const auto& [body, want] : std::vector<std::pair<std::string, int>>{
           {R"({"prompt":"hi","echo":true,"logprobs":2})", 2},
           {R"({"prompt":"hi","echo":true,"logprobs":0})", 0},
           {R"({"prompt":"hi","echo":true})", -1}}) {
    auto e = completion(body);
    ASSERT_TRUE(e.ok()) << body;
    EXPECT_EQ(to_engine_request(e.value(), 0, m_, 1).prompt_logprobs, want) << body;
  }
  auto salted = chat(R"({"messages":[{"role":"user","content":"x"}],"cache_salt":"tenant-7"})");
  ASSERT_TRUE(salted.ok()) << salted.error().message;
  EXPECT_EQ(to_engine_request(salted.value(), 0, m_, 1).cache_salt, "tenant-7");
  auto mt = completion(R"({"prompt":"hi","max_tokens":8,"min_tokens":8})");
  ASSERT_TRUE(mt.ok()) << mt.error().message;
  EXPECT_EQ(to_engine_request(mt.value(), 0, m_, 1).min_tokens, 8);
  auto noseed = completion(R"({"prompt":"hi","ignore_eos":true})");
  ASSERT_TRUE(noseed.ok());
  engine::Request er = to_engine_request(noseed.value(), 0, m_, 555);
  EXPECT_EQ(er.sampling.seed, 555u);
  EXPECT_TRUE(er.stop_ids.empty());
  auto neg = completion(R"({"prompt":"hi","seed":-1})");
  ASSERT_TRUE(neg.ok());
  EXPECT_EQ(to_engine_request(neg.value(), 0, m_, 0).sampling.seed, ~uint64_t{0});
}

TEST_F(OpenAiApi, TokenizeAndDetokenize) {
  auto t = tokenize_request(R"({"model":"test-model","prompt":"Hello world","return_token_strs":true})", m_);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const json& tj = t.value();
  EXPECT_EQ(tj["count"], tj["tokens"].size());
  EXPECT_EQ(tj["max_model_len"], 128);
  EXPECT_EQ(tj["token_strs"].size(), tj["tokens"].size());
  auto d = detokenize_request(json{{"tokens", tj["tokens"]}}.dump(), m_);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d.value()["prompt"], "Hello world");
  auto chat_t = tokenize_request(R"({"messages":[{"role":"user","content":"Hi"}]})", m_);
  ASSERT_TRUE(chat_t.ok()) << chat_t.error().message;
  EXPECT_GT(chat_t.value()["count"].get<int>(), 3);

  for (const char* body : {"{", "[]", R"({})", R"({"prompt":5})", R"({"prompt":"x","add_special_tokens":"no"})",
                           R"({"messages":"x"})"}) {
    auto r = tokenize_request(body, m_);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().status, 400) << body;
  }
  EXPECT_EQ(tokenize_request(R"({"model":"zzz","prompt":"x"})", m_).error().status, 404);
  for (const char* body : {R"({})", R"({"tokens":"x"})", R"({"tokens":[1.5]})", R"({"tokens":[-1]})",
                           R"({"tokens":[123456789]})", "nope"}) {
    auto r = detokenize_request(body, m_);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().status, 400) << body;
  }
}

TEST_F(OpenAiApi, ErrorBodyShape) {
  ApiError e;
  e.status = 404;
  e.message = "nope";
  e.param = "model";
  e.code = "model_not_found";
  const json j = json::parse(error_body(e));
  EXPECT_EQ(j["error"]["message"], "nope");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  ApiError bare;
  bare.message = "x";
  const json b = json::parse(error_body(bare));
  EXPECT_TRUE(b["error"]["param"].is_null());
  EXPECT_TRUE(b["error"]["code"].is_null());
}

TEST_F(OpenAiApi, ResponseShapes) {
  auto r = completion(R"({"prompt":"Hi","n":2,"logprobs":1,"echo":true})");
  ASSERT_TRUE(r.ok());
  const GenerationRequest& g = r.value();
  std::vector<ChoiceOutput> outs(2);
  outs[0].index = 0;
  outs[0].text = " there";
  outs[0].finish_reason = "length";
  outs[0].completion_tokens = 1;
  outs[0].logprobs.push_back(TokenLogprob{5, -0.5f, {{5, -0.5f}, {6, -1.5f}}});
  outs[1].index = 1;
  outs[1].text = "!";
  outs[1].finish_reason = "stop";
  outs[1].stop_reason = "\n";
  outs[1].completion_tokens = 2;
  const json c = completion_response(g, m_, "cmpl-1", 42, outs);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["model"], "test-model");
  EXPECT_EQ(c["choices"][0]["text"], "Hi there");
  EXPECT_EQ(c["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(c["choices"][1]["stop_reason"], "\n");
  EXPECT_EQ(c["usage"]["completion_tokens"], 3);
  EXPECT_EQ(c["usage"]["total_tokens"], c["usage"]["prompt_tokens"].get<int>() + 3);
  const json& lp = c["choices"][0]["logprobs"];
  const size_t nprompt = g.prompts[0].ids.size();
  ASSERT_EQ(lp["tokens"].size(), nprompt + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << "echoed prompt tokens have no logprob";
  EXPECT_FLOAT_EQ(lp["token_logprobs"][nprompt].get<float>(), -0.5f);
  EXPECT_EQ(lp["top_logprobs"][nprompt].size(), 2u);
  EXPECT_EQ(lp["text_offset"][nprompt], 2);

  // As OpenAI writes them: keys in insertion order (envelope first), a top_logprobs dict most likely
  // first — here against the alphabetical order of the token strings, which a std::map would give.
  std::vector<int32_t> ids;
  for (const char* c : {"q", "b", "x", "m"}) {
    const auto one = tok_->encode(c, false, false);
    ASSERT_EQ(one.size(), 1u) << c;
    ids.push_back(one[0]);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return tok_->token_to_piece(a) > tok_->token_to_piece(b); });
  std::vector<ChoiceOutput> ranked = outs;
  ranked[0].logprobs = {TokenLogprob{ids[0], -0.1f, {{ids[0], -0.1f}, {ids[1], -1.0f}, {ids[2], -2.0f}, {ids[3], -3.0f}}}};
  const auto dumped = nlohmann::ordered_json::parse(dump_json(completion_response(g, m_, "cmpl-1", 42, ranked)));
  std::vector<std::string> keys;
  for (auto it = dumped.begin(); it != dumped.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"id", "object", "created", "model", "choices", "usage"}));
  const auto& top = dumped["choices"][0]["logprobs"]["top_logprobs"][nprompt];
  std::vector<float> order;
  for (auto it = top.begin(); it != top.end(); ++it) order.push_back(it.value().get<float>());
  EXPECT_EQ(order, (std::vector<float>{-0.1f, -1.0f, -2.0f, -3.0f}));

  auto cr = chat(R"({"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":2,"stream":true,
      "stream_options":{"include_usage":true}})");
  ASSERT_TRUE(cr.ok());
  const json ch = chat_response(cr.value(), m_, "chatcmpl-1", 42, {outs[0]});
  EXPECT_EQ(ch["object"], "chat.completion");
  EXPECT_EQ(ch["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(ch["choices"][0]["message"]["content"], " there");
  ASSERT_EQ(ch["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(ch["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(ch["choices"][0]["logprobs"]["content"][0]["bytes"].is_array());
  const std::string text = "x";
  const json chunk = chat_chunk(cr.value(), m_, "chatcmpl-1", 42, 0, nullptr, &text, nullptr, nullptr);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "x");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk.contains("usage") && chunk["usage"].is_null());
  const json fin = chat_chunk(cr.value(), m_, "chatcmpl-1", 42, 0, nullptr, nullptr, nullptr, "stop");
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  const json u = usage_chunk(cr.value(), m_, "chatcmpl-1", 42, Usage{3, 4});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 7);
  // Partial UTF-8 in a token's text must not break serialization.
  EXPECT_NO_THROW((void)dump_json(json{{"t", std::string("\xe4\xbd")}}));
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
  const json models = models_response(m_);
  EXPECT_EQ(models["data"][0]["id"], "test-model");
}

}  // namespace

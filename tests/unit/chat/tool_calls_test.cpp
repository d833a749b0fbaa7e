// Tool calls in the models' own formats: templates with tools and calls against transformers'
// renders of the real templates, Python's json.dumps against Python, and the parsers against the
// calls the templates themselves write (tests/data/tokenizer/chat_tool_cases.json, written by
// tools/gen_chat_tool_cases.py).
#include <gtest/gtest.h>

#include "chat/chat.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ss::chat {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& cases() {
  static const ojson j = ojson::parse(test::read_text(test::data_dir() + "chat_tool_cases.json"));
  return j;
}

ToolFormat format_of(const std::string& template_name) {
  return tool_format(cases()["templates"][template_name].get<std::string>());
}

TEST(PyJsonDumps, MatchesPython) {
  size_t n = 0;
  for (const ojson& c : cases()["dumps"]) {
    EXPECT_EQ(py_json_dumps(c["value"]), c["compact"].get<std::string>()) << c["value"].dump();
    EXPECT_EQ(py_json_dumps(c["value"], 4), c["indent4"].get<std::string>()) << c["value"].dump();
    ++n;
  }
  EXPECT_GE(n, 9u);
}

TEST(ToolTemplates, FormatsRecognised) {
  EXPECT_EQ(format_of("qwen2.5"), ToolFormat::Hermes);
  EXPECT_EQ(format_of("llama3.2"), ToolFormat::Llama3Json);
  EXPECT_EQ(format_of("llama3.1-style"), ToolFormat::Llama3Json);
  EXPECT_EQ(format_of("smollm2"), ToolFormat::None);
  EXPECT_EQ(format_of("chatml"), ToolFormat::None);
  EXPECT_EQ(format_of("llama3"), ToolFormat::None);
  EXPECT_STREQ(tool_format_name(ToolFormat::Hermes), "hermes");
}

TEST(ToolTemplates, MatchTransformersRenders) {
  size_t n = 0, errors = 0;
  for (const ojson& c : cases()["cases"]) {
    const std::string name = c["template"];
    std::vector<ChatMessage> msgs;
    for (const ojson& m : c["messages"]) {
      ChatMessage cm{m["role"], m["content"].is_null() ? "" : m["content"].get<std::string>(), {}};
      if (m.contains("tool_calls"))
        for (const ojson& tc : m["tool_calls"])
          cm.tool_calls.push_back({tc["function"]["name"], tc["function"]["arguments"].dump()});
      msgs.push_back(std::move(cm));
    }
    test::NamesOnly names(c["bos"], c["eos"]);
    const std::string tools = c["tools"].is_null() ? "" : c["tools"].dump();
    auto r = render_chat(cases()["templates"][name].get<std::string>(), msgs, c["add_generation_prompt"], &names,
                         c["date_string"].get<std::string>(), tools);
    const std::string what = name + ", " + std::to_string(msgs.size()) + " messages, " +
                             (tools.empty() ? "no tools" : std::to_string(c["tools"].size()) + " tools") +
                             (c["add_generation_prompt"].get<bool>() ? ", generation prompt" : "");
    if (c.contains("error")) {
      EXPECT_FALSE(r.ok()) << what << " should fail as the template does: " << c["error"];
      ++errors;
    } else {
      ASSERT_TRUE(r.ok()) << what << ": " << r.message();
      EXPECT_EQ(*r, c["expected"].get<std::string>()) << what;
    }
    ++n;
  }
  std::printf("[tools] %zu renders compared (%zu template errors)\n", n, errors);
  EXPECT_GE(n, 140u);
  EXPECT_GE(errors, 1u);
}

TEST(ToolTemplates, CallsNeedAFormat) {
  const std::vector<ChatMessage> msgs{{"user", "q", {}}, {"assistant", "", {{"f", "{}"}}}};
  for (const char* name : {"smollm2", "chatml", "llama3"}) {
    auto r = render_chat(cases()["templates"][name].get<std::string>(), msgs, true);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_NE(r.message().find("tool calls"), std::string::npos) << r.message();
  }
  const std::vector<ChatMessage> bad{{"user", "q", {}}, {"assistant", "", {{"f", "{not json"}}}};
  auto r = render_chat(cases()["templates"]["qwen2.5"].get<std::string>(), bad, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("not JSON"), std::string::npos) << r.message();
  EXPECT_FALSE(render_chat(cases()["templates"]["qwen2.5"].get<std::string>(), {{"user", "q", {}}}, true, nullptr, {},
                           "{\"not\": \"an array\"}")
                   .ok());
}

// The calls each template writes for an assistant turn come back from its parser, name and arguments.
TEST(ToolParsers, RecoverTheCallsTemplatesWrite) {
  size_t n = 0;
  for (const ojson& p : cases()["parses"]) {
    const ToolFormat f = format_of(p["template"]);
    const std::string text = p["text"];
    const ParsedToolOutput out = parse_tool_calls(f, text);
    ASSERT_EQ(out.calls.size(), p["calls"].size()) << text;
    for (size_t k = 0; k < out.calls.size(); ++k) {
      EXPECT_EQ(out.calls[k].name, p["calls"][k]["name"].get<std::string>()) << text;
      EXPECT_EQ(ojson::parse(out.calls[k].arguments), p["calls"][k]["arguments"]) << text;
      EXPECT_EQ(out.calls[k].arguments, py_json_dumps(p["calls"][k]["arguments"])) << text;
    }
    // Content: the text before the calls (Qwen writes "\n" between it and the first call).
    const std::string content = p["content"].is_null() ? "" : p["content"].get<std::string>();
    EXPECT_EQ(out.content, content.empty() ? "" : content + "\n") << text;
    // Streaming: no byte of a call is ever let out as content.
    size_t last = 0;
    for (size_t len = 0; len <= text.size(); ++len) {
      const size_t k = tool_content_prefix(f, std::string_view(text).substr(0, len));
      EXPECT_LE(k, len);
      EXPECT_GE(k, last) << "must not shrink at " << len << " of " << text;
      EXPECT_EQ(tool_content_prefix(f, std::string_view(text).substr(0, len), last), k) << "resumed at " << last;
      EXPECT_LE(k, out.content.size()) << "a call's bytes streamed as content at " << len << " of " << text;
      last = k;
    }
    ++n;
  }
  EXPECT_GE(n, 8u);
}

TEST(ToolParsers, WhatIsNotAWholeCallStaysContent) {
  const auto H = ToolFormat::Hermes, L = ToolFormat::Llama3Json;
  for (const std::string t : {"plain answer", "", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1",
                              "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
                              "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",
                              "<tool_call>\nnot json\n</tool_call>",
                              "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing\n</tool_call>"}) {
    const ParsedToolOutput out = parse_tool_calls(H, t);
    EXPECT_TRUE(out.calls.empty()) << t;
    EXPECT_EQ(out.content, t);
  }
  for (const std::string t : {"Sure: {\"name\": \"f\", \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": {",
                              "{\"name\": \"f\"}", "{\"name\": \"f\", \"parameters\": {}} and more",
                              "{\"name\": \"f\", \"parameters\": {}};"}) {
    const ParsedToolOutput out = parse_tool_calls(L, t);
    EXPECT_TRUE(out.calls.empty()) << t;
    EXPECT_EQ(out.content, t);
  }
  EXPECT_TRUE(parse_tool_calls(ToolFormat::None, "{\"name\": \"f\", \"parameters\": {}}").calls.empty());
}

TEST(ToolParsers, DepthIsBounded) {
  EXPECT_EQ(json_max_depth(R"({"a": [1, {"b": "[[[{{"}]})"), 3u);
  EXPECT_EQ(json_max_depth(R"("\"[[[")"), 0u);
  EXPECT_EQ(json_max_depth("]]]{"), 1u) << "not JSON: still a bound";
  // Arguments nested past the bound are not a call (printing them recurses per level).
  const std::string deep = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  const std::string call = "{\"name\": \"f\", \"parameters\": {\"x\": " + deep + "}}";
  EXPECT_TRUE(parse_tool_calls(ToolFormat::Llama3Json, call).calls.empty());
  const std::string shallow = std::string(kMaxJsonDepth - 2, '[') + std::string(kMaxJsonDepth - 2, ']');
  EXPECT_EQ(parse_tool_calls(ToolFormat::Llama3Json, "{\"name\": \"f\", \"parameters\": {\"x\": " + shallow + "}}")
                .calls.size(),
            1u);
  // Tools nested past it are refused before they are printed.
  auto r = render_chat(cases()["templates"]["qwen2.5"].get<std::string>(), {{"user", "q", {}}}, true, nullptr, {},
                       "[{\"type\": \"function\", \"x\": " + deep + "}]");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("deeper"), std::string::npos) << r.message();
}

TEST(ToolParsers, Variants) {
  // Hermes: the last call unclosed (generation stopped on </tool_call>), text after the calls dropped.
  auto h = parse_tool_calls(ToolFormat::Hermes, "Hi\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n");
  ASSERT_EQ(h.calls.size(), 1u);
  EXPECT_EQ(h.calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(h.content, "Hi\n");
  h = parse_tool_calls(ToolFormat::Hermes, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\n\nDone.");
  ASSERT_EQ(h.calls.size(), 1u);
  EXPECT_EQ(h.content, "");
  // Llama 3: several calls separated by ';', "arguments" also accepted, <|python_tag|> first.
  auto l = parse_tool_calls(ToolFormat::Llama3Json,
                            "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}}; {\"name\": \"b\", "
                            "\"arguments\": {}}");
  ASSERT_EQ(l.calls.size(), 2u);
  EXPECT_EQ(l.calls[0].name, "a");
  EXPECT_EQ(l.calls[0].arguments, "{\"q\": \"x;y\"}");
  EXPECT_EQ(l.calls[1].name, "b");
  EXPECT_EQ(l.content, "");
  // Streaming prefixes: hold only what may still start a call.
  EXPECT_EQ(tool_content_prefix(ToolFormat::Hermes, "abc <tool_"), 4u);
  EXPECT_EQ(tool_content_prefix(ToolFormat::Hermes, "abc <b>"), 7u);
  EXPECT_EQ(tool_content_prefix(ToolFormat::Llama3Json, "  \n"), 0u);
  EXPECT_EQ(tool_content_prefix(ToolFormat::Llama3Json, " Hello"), 6u);
  EXPECT_EQ(tool_content_prefix(ToolFormat::Llama3Json, "<|python"), 0u);
  EXPECT_EQ(tool_content_prefix(ToolFormat::Llama3Json, "<b>"), 3u);
  EXPECT_EQ(tool_content_prefix(ToolFormat::None, "<tool_call>"), 11u);
}

}  // namespace
}  // namespace ss::chat

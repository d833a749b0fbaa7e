// Chat templates against jinja2 renders of the real templates (tests/data/tokenizer/chat_cases.json),
// the families recognised from template text, and a prompt through the default model's own template.
#include <gtest/gtest.h>

#include "chat/chat.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ss::chat {
namespace {

using nlohmann::json;
using test::data_dir;
using test::NamesOnly;

std::unique_ptr<tok::Tokenizer> fixture(const std::string& name) {
  auto r = tok::Tokenizer::from_json_text(test::read_text(data_dir() + name + ".tokenizer.json"),
                                          test::read_text(data_dir() + name + ".tokenizer_config.json"), name);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.message());
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(ChatTemplate, MatchesJinjaRenders) {
  json j = test::read_json(data_dir() + "chat_cases.json");
  size_t n = 0;
  for (const auto& c : j["cases"]) {
    std::string name = c["template"];
    std::string tmpl = j["templates"][name];
    std::vector<ChatMessage> msgs;
    for (const auto& m : c["messages"]) msgs.push_back({m["role"], m["content"]});
    NamesOnly names(c["bos"], c["eos"]);
    std::string date = c.value("date_string", "");
    auto r = render_chat(tmpl, msgs, c["add_generation_prompt"], &names, date);
    std::string what = name + " with " + std::to_string(msgs.size()) + " messages, first \"" + msgs[0].content + "\"";
    if (c.contains("error")) {
      EXPECT_FALSE(r.ok()) << what << " should fail like jinja: " << c["error"];
    } else {
      ASSERT_TRUE(r.ok()) << what << ": " << r.message();
      EXPECT_EQ(*r, c["expected"].get<std::string>()) << what;
    }
    ++n;
  }
  std::printf("[chat] %zu renders compared\n", n);
  EXPECT_GT(n, 100u);
}

TEST(ChatTemplate, FamiliesAndErrors) {
  json j = test::read_json(data_dir() + "chat_cases.json");
  EXPECT_EQ(detect_chat_family(j["templates"]["smollm2"].get<std::string>()), ChatFamily::ChatML);
  EXPECT_EQ(detect_chat_family(j["templates"]["qwen2.5"].get<std::string>()), ChatFamily::ChatML);
  EXPECT_EQ(detect_chat_family(j["templates"]["llama3.2"].get<std::string>()), ChatFamily::Llama3);
  EXPECT_EQ(detect_chat_family(j["templates"]["llama2"].get<std::string>()), ChatFamily::Llama2);
  EXPECT_EQ(detect_chat_family(j["templates"]["mistral"].get<std::string>()), ChatFamily::Mistral);
  EXPECT_STREQ(chat_family_name(ChatFamily::Llama3), "llama3");

  auto r = render_chat("{{ messages[0].content }}<|weird|>", {{"user", "x"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("<|weird|>"), std::string::npos) << r.message();
  EXPECT_EQ(detect_chat_family("{{ messages[0].content }}"), ChatFamily::Unknown);

  // Empty template: ChatML only when the vocabulary has <|im_start|>.
  auto llama = fixture("llama3");
  auto qwen = fixture("qwen2");
  ASSERT_TRUE(llama && qwen);
  EXPECT_FALSE(render_chat("", {{"user", "x"}}, true, llama.get()).ok());
  auto q = render_chat("", {{"user", "x"}}, true, qwen.get());
  ASSERT_TRUE(q.ok()) << q.message();
  EXPECT_EQ(*q, "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");

  // The family's usual tokens when no tokenizer is given.
  auto l3 = render_chat(j["templates"]["llama3"].get<std::string>(), {{"user", " hi "}}, false);
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(*l3, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
}

TEST(ChatTemplate, FamilyOfATemplateReadBesideTheTokenizer) {
  auto t = fixture("llama3");  // the template comes from tokenizer_config.json
  ASSERT_TRUE(t);
  EXPECT_EQ(detect_chat_family(t->chat_template()), ChatFamily::Llama3);
}

TEST(ChatTemplate, SmolLM2PromptThroughItsOwnTemplate) {
  tok::TokenizerSpec spec;
  if (!test::read_gguf_spec(test::smollm2_gguf(), spec)) GTEST_SKIP() << "no model at " << test::smollm2_gguf();
  auto r = tok::Tokenizer::from_spec(spec);
  ASSERT_TRUE(r.ok()) << r.message();
  const tok::Tokenizer& t = **r;
  auto prompt = render_chat(t.chat_template(), {{"user", "What is 2+2?"}}, true, &t);
  ASSERT_TRUE(prompt.ok()) << prompt.message();
  auto ids = t.encode(*prompt, false, true);
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>
  EXPECT_EQ(t.decode(ids), *prompt);
}

}  // namespace
}  // namespace ss::chat

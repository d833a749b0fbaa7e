#!/usr/bin/env python3
"""Reference renders of chat templates with OpenAI tools, for tests/unit/tokenizer.

Writes tests/data/tokenizer/chat_tool_cases.json:
  templates  the real template texts (read from chat_cases.json, which gen_tokenizer_ref.py writes)
  cases      conversations with tools / tool calls / tool results, rendered by transformers'
             render_jinja_template (what apply_chat_template and vLLM use), or the error it raised
  dumps      JSON values and Python's json.dumps(ensure_ascii=False) of them, compact and indent=4
             (the `tojson` filter transformers gives templates)
  parses     assistant turns with tool calls as each template writes them (rendered, then cut out of
             the render), for the tool-call parsers: the calls must come back

Needs: pip install transformers jinja2 (no model, no torch).
"""
import json
import os
import sys

from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather in a city. Température en °C; \"quotes\", back\\slash, tab\there.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "City name, e.g. Oslo"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                  "days": {"type": "integer", "minimum": 0, "maximum": 14, "default": 1}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 200},
        "filters": {"type": "object", "properties": {}, "additionalProperties": True},
        "tags": {"type": "array", "items": {"type": "string"}, "default": []},
        "threshold": {"type": "number", "minimum": 0.0, "maximum": 1.5, "default": 1e-05, "examples": [1e16, 1e15, 0.1, -2.5e-7, 123456789012.0]},
        "flag": {"type": "boolean", "default": False}, "nothing": {"default": None}}}}}
NO_PARAMS = {"type": "function", "function": {"name": "now", "description": "日本語の説明 😀 \u2028 ctrl\u0001"}}

TOOLS = [[WEATHER], [WEATHER, SEARCH, NO_PARAMS]]


def call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


U, A, S = "user", "assistant", "system"
CONVS = [
    [{"role": U, "content": "What is the weather in Oslo?"}],
    [{"role": S, "content": "You are a helpful agent."}, {"role": U, "content": " Weather in Oslo? "}],
    [{"role": U, "content": "Weather in Oslo?"},
     {"role": A, "content": None, "tool_calls": [call("get_weather", {"city": "Oslo", "days": 2})]},
     {"role": "tool", "content": "{\"temp\": -3.5}"},
     {"role": U, "content": "And tomorrow?"}],
    [{"role": S, "content": "sys"}, {"role": U, "content": "Two things"},
     {"role": A, "content": "Let me look.",
      "tool_calls": [call("get_weather", {"city": "Zürich"}), call("search", {"query": "a \"b\"", "tags": []})]},
     {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "nothing found"}],
    [{"role": U, "content": "hi"}, {"role": A, "content": "hello"}, {"role": U, "content": "bye"}],
]


def dumps_cases():
    values = [WEATHER, SEARCH, NO_PARAMS, {}, [], [{}], {"a": [1, [2, {}]], "b": {"c": None}},
              [0.1, 1.0, -0.0, 1e16, 1e15, 123456789.125, 5e-324, 1.7976931348623157e308, 1e-4, 1e-5, 100, -7],
              "plain \u007f \u0000 \u001f \u2028 é 😀 \\ \" / \b\f\n\r\t"]
    return [{"value": v, "compact": json.dumps(v, ensure_ascii=False),
             "indent4": json.dumps(v, ensure_ascii=False, indent=4)} for v in values]


def main():
    chat = json.load(open(os.path.join(DATA, "chat_cases.json")))
    templates = chat["templates"]
    names = {"qwen2.5": ("", "<|im_end|>"), "llama3.2": ("<|begin_of_text|>", "<|eot_id|>"),
             "llama3.1-style": ("<|begin_of_text|>", "<|eot_id|>"), "smollm2": ("<|im_start|>", "<|im_end|>"),
             "chatml": ("", "<|im_end|>"), "llama3": ("<|begin_of_text|>", "<|eot_id|>")}
    date = "15 Mar 2025"
    cases = []
    for name, (bos, eos) in names.items():
        native = name in ("qwen2.5", "llama3.2", "llama3.1-style")
        for tools in TOOLS + [None]:
            for conv in CONVS:
                history = any(m.get("tool_calls") or m["role"] == "tool" for m in conv)
                if history and not native:
                    continue  # these templates cannot print calls (content None); the server writes them as text
                for gen in (True, False):
                    case = {"template": name, "messages": conv, "tools": tools, "add_generation_prompt": gen,
                            "bos": bos, "eos": eos, "date_string": date}
                    try:
                        case["expected"] = render_jinja_template([conv], tools=tools, chat_template=templates[name],
                                                                 add_generation_prompt=gen, bos_token=bos,
                                                                 eos_token=eos, date_string=date)[0][0]
                    except Exception as e:  # the template's raise_exception, or a type error inside it
                        case["error"] = "%s: %s" % (type(e).__name__, e)
                    cases.append(case)
    # Each native template's writing of an assistant turn with calls: render the conversation up to
    # the user turn with the generation prompt, and with the assistant turn; the difference minus the
    # end-of-turn token is what the model would generate.
    parses = []
    for name in ("qwen2.5", "llama3.2"):
        bos, eos = names[name]
        for calls, content in (([call("get_weather", {"city": "Oslo"})], None),
                               ([call("get_weather", {"city": "Zürich", "unit": "celsius", "days": 3})], None),
                               ([call("now", {})], None),
                               ([call("search", {"query": "x", "filters": {"a": [1, 2.5, None]}}),
                                 call("get_weather", {"city": "Oslo"})], "Let me check both."),
                               ([call("search", {"query": "</tool_call> \"<tool_call>\" \\ é"})], None)):
            head = [{"role": U, "content": "q"}]
            turn = {"role": A, "content": content, "tool_calls": calls}
            kw = dict(tools=[WEATHER, SEARCH, NO_PARAMS], chat_template=templates[name], bos_token=bos,
                      eos_token=eos, date_string=date)
            try:
                a = render_jinja_template([head], add_generation_prompt=True, **kw)[0][0]
                b = render_jinja_template([head + [turn]], **kw)[0][0]
            except Exception:
                continue  # llama3.2 takes one call per turn
            assert b.startswith(a), name
            gen = b[len(a):]
            end = eos + "\n" if gen.endswith(eos + "\n") else eos
            assert gen.endswith(end), (name, gen)
            parses.append({"template": name, "text": gen[:-len(end)], "content": content,
                           "calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                     for c in calls]})
    out = {"templates": {k: templates[k] for k in names}, "cases": cases, "dumps": dumps_cases(), "parses": parses}
    path = os.path.join(DATA, "chat_tool_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %s: %d renders (%d errors), %d dumps, %d parses" % (
        path, len(cases), sum("error" in c for c in cases), len(out["dumps"]), len(parses)), file=sys.stderr)


if __name__ == "__main__":
    main()

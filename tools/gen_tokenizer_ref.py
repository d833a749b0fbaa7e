#!/usr/bin/env python3
"""Reference data for tests/unit/tokenizer: token ids from Hugging Face `tokenizers` on a corpus,
small synthetic tokenizers, and chat-template renders from jinja2.

Writes tests/data/tokenizer/:
  corpus.json                 the strings (invalid UTF-8 cases as {"hex": ...})
  <name>.tokenizer.json       synthetic tokenizers trained here (llama3, qwen2, gpt2, spm)
  <name>.tokenizer_config.json
  <name>.expected.json        ids per corpus string (HF encode, add_special_tokens=False), ids with
                              special tokens not parsed (encode_special_tokens=True) where they differ,
                              and HF's decode where it differs from the input
  smollm2.expected.json       the same for SmolLM2-135M-Instruct (tokenizer from the GGUF's vocab and
                              merges with SmolLM2's real pre-tokenizer: Digits(individual) + ByteLevel)
  chat_cases.json             chat conversations rendered by jinja2 with the real templates
  nfc.json                    HF's NFC of "a" + c + U+0301 + c for every code point c below U+30000
                              (and the tags/variation selectors block), where it changes the string

Run: python3 tools/gen_tokenizer_ref.py [--gguf PATH]   (deterministic; commit the output)
"""
import argparse
import json
import os
import random
import sys
import unicodedata

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
DEFAULT_GGUF = os.path.expanduser("~/.cache/selfserve/models/SmolLM2-135M-Instruct.Q4_1.gguf")

LLAMA3_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_RE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# ---------------------------------------------------------------------------------------------------
# Corpus

WORDS = """the of and to in is was for on that with as by at from his her it an were are which this be or
has had not but what all when there can more one about would their if will up out so them some time
could into people year two way day man new could state very world school still life hand system
program number part government interest between quick brown fox jumps over lazy dog tokenizer model
inference server request response latency throughput kernel memory cache attention layer weight
Hello World Python JavaScript Rust GPU CPU HTTP JSON API URL NASA McDonald O'Neill iPhone eBay
don't won't can't I'm you're they've we'll she'd it's He's THEY'RE WE'VE YOU'LL I'D IT'S""".split()

SNIPPETS = [
    "Hello, world!", "Hello world", " Hello", "  Hello", "hello\nworld", "Hello\n\nWorld\n", "\n", "\n\n\n", " ", "  ",
    "\t", "\t\t", " \t \n ", "a\r\nb", "\r\n\r\n", "trailing   ", "   leading", "mid    spaces", "tab\tseparated\tvalues",
    "I'm sure they'll say it's fine, don't you think? We've seen it.", "IT'S THEY'LL WE'RE I'M YOU'VE HE'D",
    "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "'ſ 'ſa x'ſ", "'Re 'rE 'lL", "rock'n'roll", "''quoted''",
    "Numbers 12345 and 3.14159 and 1,000,000", "0", "00", "123", "1234", "12345678901234567890", "3.14", "-42", "+1e10",
    "v1.2.3", "2024-01-15", "10:30pm", "$100", "100%", "#1", "a1b2c3", "x = 42;", "١٢٣ ٤٥٦", "Ⅻ ⅻ ½ ¾ ² ³", "𝟘𝟙𝟚",
    "Café naïve résumé façade Ångström", "e\u0301 combining", "A\u030a", "n\u0303", "\u1e9b\u0323", "ﬁ ﬂ ﬀ",
    "你好，世界！这是一个测试。", "日本語のテキストとカタカナ ー", "한국어 텍스트입니다", "Россия и Україна", "Ελληνικά κείμενα",
    "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Tiếng Việt có dấu", "ሰላም ዓለም", "ᚠᛇᚻ᛫ᛒᛦᚦ",
    "Emoji: 😀👍🏽🇺🇸 and ❤️", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🤖🚀✨", "😀😃😄😁", "©®™", "→←↑↓", "∀x∈ℝ: x²≥0", "≠≤≥±∞",
    "zero\u200bwidth and\u00a0nbsp", "soft\u00adhyphen", "line\u2028sep", "para\u2029sep", "nel\u0085x", "ideographic\u3000space",
    "thin\u2009space", "vt\x0bff\x0c", "ctrl\x01\x02\x1f\x7f", "bell\x07", "\x00nul",
    "def foo(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}', "SELECT * FROM users WHERE id = 42;",
    "<html><body class=\"main\">Hi</body></html>", "if (a && b || !c) { return; }", "x->y; a::b; c <=> d; e >>= 2;",
    "#include <vector>\nint main() { return 0; }\n", "    indented\n        more\n", "`code` **bold** _it_ ~~s~~",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Users\\name\\file.txt", "/usr/local/bin",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "text<|endoftext|>more",
    "<|im_start|><|im_end|>", "<|im_", "<|im_start", "|>", "<s>hello</s>", "<s> </s>", "<unk>", "a<s>b", "< s >",
    "<|begin_of_text|>Hi<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHello", "<|eot_id|><|eot_id|>",
    "[MASK] and  [MASK]x", "x [MASK] y", "<tool_call> call </tool_call>", "<|x|> and <|y|>", "<|endoftext|><|endoftext|>",
    "<repo_name>a/b<file_sep>main.py", "....", "!!!???", "---", "___", "...\n", "?\n\n", "a.\r\n", "end.\n\n\nstart",
    "   \n   \n", " \n", "\n ", "x \n y", "1 \n2", "a  b   c    d", "A\tB\t\tC", "...  ...", "a , b", "(x)", "[y]", "{z}",
    "ÀÉÎÕÜ àéîõü ÇçÑñ ßẞ", "ǅǈǋ", "İstanbul ıi", "ΣΑΣ σας", "ﬀﬃ", "Å Ω K", "ﾊﾝｶｸ", "ｆｕｌｌｗｉｄｔｈ １２３",
]

SCRIPTS = [
    (0x0041, 0x007A), (0x00C0, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0590, 0x05FF), (0x0600, 0x06FF),
    (0x0900, 0x097F), (0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
    (0x1F300, 0x1F6FF), (0x2000, 0x206F), (0x2190, 0x22FF), (0x0300, 0x036F), (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF),
]


def random_cp(rng):
    while True:
        r = rng.random()
        if r < 0.5:
            c = rng.randint(0, 0x7F)
        elif r < 0.8:
            c = rng.randint(0x80, 0xFFFF)
        else:
            c = rng.randint(0x10000, 0x10FFFF)
        if not 0xD800 <= c <= 0xDFFF:
            return c


def build_corpus():
    rng = random.Random(20240611)
    out = list(SNIPPETS)
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<|eot_id|>", "<|begin_of_text|>",
                "[MASK]", "<tool_call>", "<|x|>", "<repo_name>"]
    seps = [" ", " ", " ", "  ", "\n", "\t", ", ", ". ", "\n\n", " \n", "\r\n", "   "]
    for _ in range(900):  # English-like sentences
        n = rng.randint(1, 25)
        s = ""
        for i in range(n):
            w = rng.choice(WORDS)
            if rng.random() < 0.1:
                w = w.upper()
            elif rng.random() < 0.1:
                w = w.capitalize()
            if rng.random() < 0.08:
                w += str(rng.randint(0, 10 ** rng.randint(1, 7)))
            s += w + (rng.choice(seps) if i + 1 < n else rng.choice(["", ".", "!", "?", "\n", " ", "..."]))
        out.append(s)
    for _ in range(500):  # mixtures of snippets, with special tokens in text
        parts = [rng.choice(SNIPPETS) for _ in range(rng.randint(2, 5))]
        if rng.random() < 0.4:
            parts.insert(rng.randint(0, len(parts)), rng.choice(specials))
        out.append(rng.choice(["", " ", "\n"]).join(parts))
    for _ in range(500):  # script runs with spaces, digits and punctuation
        s = ""
        for _ in range(rng.randint(1, 12)):
            lo, hi = rng.choice(SCRIPTS)
            s += "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
            s += rng.choice([" ", "", "\n", "1", "23", ".", ", ", "  ", "\t", "'s "])
        out.append(s)
    for _ in range(400):  # random code points from all planes
        out.append("".join(chr(random_cp(rng)) for _ in range(rng.randint(1, 24))))
    for _ in range(300):  # whitespace and digit stress
        alphabet = [" ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "a", "Z", "1", "22", "333", ".", "'", "é", "中", "😀"]
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20))))
    for _ in range(200):  # decomposed text (NFD), for NFC normalization
        s = " ".join(rng.choice(WORDS + ["Café", "naïve", "Ångström", "résumé", "Ελληνικά", "Tiếng Việt", "한국어"])
                     for _ in range(rng.randint(1, 6)))
        out.append(unicodedata.normalize("NFD", s))
    for _ in range(60):  # long texts
        out.append(" ".join(rng.choice(out[:2000]) for _ in range(rng.randint(10, 25))))
    bad = [b"\xff", b"abc\xffdef", b"\xe2\x82", b"\xe2\x82A", b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80\xf0", b"\xc0\xaf",
           b"\xed\xa0\x80x", b"\xf4\x90\x80\x80", b"\x80\x80", b"caf\xe9", b"\xef\xbb\xbfBOM", b"a\xc3", b"\xc3\x28"]
    for _ in range(100):
        b = bytearray("".join(rng.choice(SNIPPETS[:60])).encode())
        for _ in range(rng.randint(1, 4)):
            b.insert(rng.randint(0, len(b)), rng.randint(0x80, 0xFF))
        bad.append(bytes(b))
    return out, bad


# ---------------------------------------------------------------------------------------------------
# Tokenizers

def added(tok, content, special=True, **kw):
    from tokenizers import AddedToken
    return AddedToken(content, special=special, normalized=kw.get("normalized", False), lstrip=kw.get("lstrip", False),
                      rstrip=kw.get("rstrip", False), single_word=kw.get("single_word", False))


def train_bytelevel(texts, split_re, specials, vocab_size, normalizer=None, ignore_merges=False, use_regex=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    steps = []
    if split_re is not None:
        steps.append(pre_tokenizers.Split(Regex(split_re), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def train_spm(texts, vocab_size):
    """A Llama-2-like tokenizer: SentencePiece-style BPE with byte fallback, whose merges are derived
    from piece scores the way transformers' SentencePieceExtractor does."""
    # The alphabet: the 400 most frequent characters (ties by code point), so that training is
    # deterministic; other characters are left out of the training text (they use byte fallback).
    counts = {}
    for t in texts:
        for ch in t.replace(" ", "\u2581"):
            counts[ch] = counts.get(ch, 0) + 1
    alphabet = set(sorted(counts, key=lambda ch: (-counts[ch], ch))[:400])
    texts = ["".join(ch for ch in t if ch in alphabet or ch == " ") for t in texts]
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[],
                                  initial_alphabet=sorted(alphabet), show_progress=False)
    base.train_from_iterator(texts, trainer)
    tj = json.loads(base.to_str())
    trained = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
    merged = {a + b: r for r, (a, b) in enumerate(tuple(m) if isinstance(m, list) else m.split(" ", 1)
                                                for m in tj["model"]["merges"])}
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    types = [2, 3, 3] + [6] * 256
    seen = set(pieces)
    chars = sorted(t for t, _ in trained if t not in merged)  # trainer ids of equal-count chars vary
    for t in chars:  # single characters: never the result of a merge
        if t not in seen:
            pieces.append(t); scores.append(-1e9); types.append(1); seen.add(t)
    for t, r in sorted(merged.items(), key=lambda kv: kv[1]):
        if t not in seen:
            pieces.append(t); scores.append(-float(r)); types.append(1); seen.add(t)
    vocab = {p: i for i, p in enumerate(pieces)}
    normal = [i for i, ty in enumerate(types) if ty == 1]
    merges = []
    for i in sorted(normal, key=lambda i: (-scores[i], i)):
        p = pieces[i]
        for cut in range(1, len(p)):
            a, b = p[:cut], p[cut:]
            if a in vocab and b in vocab and types[vocab[a]] == 1 and types[vocab[b]] == 1:
                merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([added(tok, "<unk>"), added(tok, "<s>"), added(tok, "</s>")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    spec = {"model": "llama", "pre": "default", "tokens": pieces, "scores": scores, "token_types": types,
            "bos_id": 1, "eos_id": 2, "unk_id": 0, "add_bos": True, "add_space_prefix": True}
    return tok, spec


def smollm2_tokenizer(gguf_path):
    from gguf import GGUFReader
    r = GGUFReader(gguf_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ", 1)) for m in merges]))
    # SmolLM2's own tokenizer.json (HuggingFaceTB/SmolLM2-135M-Instruct): Digits then ByteLevel.
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([added(tok, t) for t, ty in zip(tokens, types) if ty == 3])
    return tok


def hf_encode(tok, text, parse_special=True):
    tok.encode_special_tokens = not parse_special
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return ids


def expected(tok, texts, bad):
    cases = []
    for t in texts:
        ids = hf_encode(tok, t)
        c = {"ids": ids}
        plain = hf_encode(tok, t, parse_special=False)
        if plain != ids:
            c["ids_plain"] = plain
        dec = tok.decode(ids, skip_special_tokens=False)
        if dec != t:
            c["decoded"] = dec
        cases.append(c)
    for b in bad:
        t = b.decode("utf-8", "replace")
        cases.append({"ids": hf_encode(tok, t)})
    return {"cases": cases, "with_bos": tok.encode("Hello world", add_special_tokens=True).ids}


def write_json(name, obj, compact=True):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        if compact:
            json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        else:
            json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)), file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
# Chat templates (the real texts, as stored in the models' tokenizer_config.json / GGUF)

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CHATML_PLAIN = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

LLAMA3 = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"

LLAMA32 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Llama 3.1's template prints a fixed default date ("26 Jul 2024") instead of asking strftime_now.
LLAMA31_STYLE = LLAMA32.replace("""    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}""", """    {%- set date_string = "26 Jul 2024" %}""")

LLAMA2 = "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"

MISTRAL = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"


def chat_cases(smollm_template):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    fixed_date = "15 Mar 2025"
    env.globals["strftime_now"] = lambda fmt: fixed_date
    templates = {
        "smollm2": (smollm_template, "<|im_start|>", "<|im_end|>"),
        "qwen2.5": (QWEN25, "", "<|im_end|>"),
        "chatml": (CHATML_PLAIN, "", "<|im_end|>"),
        "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
        "llama3.2": (LLAMA32, "<|begin_of_text|>", "<|eot_id|>"),
        "llama3.1-style": (LLAMA31_STYLE, "<|begin_of_text|>", "<|eot_id|>"),
        "llama2": (LLAMA2, "<s>", "</s>"),
        "mistral": (MISTRAL, "<s>", "</s>"),
    }
    U, A, S = "user", "assistant", "system"
    convs = [
        [(U, "Hello!")],
        [(S, "You are a pirate."), (U, "Hi there")],
        [(U, "What is 2+2?"), (A, "4"), (U, "And 3+3?")],
        [(S, "  Be brief.\n"), (U, "  padded content \n\n"), (A, "\tanswer\u3000"), (U, "next")],
        [(U, "多语言 émoji 😀\nline two")],
        [(S, "sys"), (U, "u1"), (A, "a1"), (U, "u2"), (A, "a2")],
        [(U, "only user, no reply wanted")],
        [(U, "x"), (U, "y")],                      # not alternating
        [(S, "s1"), (U, "q"), (S, "s2"), (A, "a")],  # system in the middle
        [(U, "call a tool"), (A, "ok"), ("tool", "result 1"), ("tool", "result 2"), (U, "thanks")],
        [(U, "\x1c\x1dcontrol-space\x1f")],
    ]
    cases = []
    for name, (tmpl, bos, eos) in templates.items():
        compiled = env.from_string(tmpl)
        for conv in convs:
            if "tool" in [r for r, _ in conv] and name not in ("qwen2.5", "chatml", "smollm2"):
                continue
            for gen in (True, False):
                msgs = [{"role": r, "content": c} for r, c in conv]
                case = {"template": name, "messages": msgs, "add_generation_prompt": gen, "bos": bos, "eos": eos}
                if name == "llama3.2":
                    case["date_string"] = fixed_date
                try:
                    case["expected"] = compiled.render(messages=msgs, add_generation_prompt=gen, bos_token=bos,
                                                       eos_token=eos)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    return {"templates": {k: v[0] for k, v in templates.items()}, "cases": cases}


def nfc_probe():
    n = normalizers.NFC()
    changed = {}
    for c in list(range(0x20, 0x30000)) + list(range(0xE0000, 0xE0200)):
        if 0xD800 <= c <= 0xDFFF:
            continue
        s = "a" + chr(c) + "\u0301" + chr(c)
        r = n.normalize_str(s)
        if r != s:
            changed["%X" % c] = r
    return {"ranges": [[0x20, 0x30000], [0xE0000, 0xE0200]], "changed": changed}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=DEFAULT_GGUF)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    texts, bad = build_corpus()
    print("corpus: %d strings + %d invalid UTF-8" % (len(texts), len(bad)), file=sys.stderr)
    write_json("corpus.json", {"texts": texts, "invalid_hex": [b.hex() for b in bad]}, compact=True)

    train_texts = texts * 3
    # Llama-3 style: Split(llama3 regex) + ByteLevel, ignore_merges, BOS added by the post-processor.
    llama3 = train_bytelevel(train_texts, LLAMA3_RE, ["<|begin_of_text|>", "<|end_of_text|>"], 3000, ignore_merges=True)
    llama3.add_special_tokens([added(llama3, t) for t in ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]])
    llama3.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                                          special_tokens=[("<|begin_of_text|>", 0)])
    # Qwen2 style: NFC + Split(qwen2 regex) + ByteLevel; a non-special added token.
    qwen2 = train_bytelevel(train_texts, QWEN2_RE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 3000,
                            normalizer=normalizers.NFC())
    qwen2.add_tokens([added(qwen2, "<tool_call>", special=False), added(qwen2, "</tool_call>", special=False)])
    # GPT-2 style: ByteLevel with its own regex; added tokens with lstrip / rstrip / not special.
    gpt2 = train_bytelevel(train_texts, None, ["<|endoftext|>"], 2000, use_regex=True)
    gpt2.add_special_tokens([added(gpt2, "[MASK]", lstrip=True), added(gpt2, "<|x|>", rstrip=True)])
    gpt2.add_tokens([added(gpt2, "<|y|>", special=False)])
    spm, spm_spec = train_spm(train_texts, 3000)

    configs = {
        "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3},
        "qwen2": {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": QWEN25},
        "gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
        "spm": {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": LLAMA2},
    }
    for name, tok in (("llama3", llama3), ("qwen2", qwen2), ("gpt2", gpt2), ("spm", spm)):
        tok.save(os.path.join(OUT, name + ".tokenizer.json"))
        write_json(name + ".tokenizer_config.json", configs[name], compact=False)
        write_json(name + ".expected.json", expected(tok, texts, bad))
    write_json("spm.spec.json", spm_spec)

    smollm_template = None
    if os.path.exists(args.gguf):
        from gguf import GGUFReader
        smol = smollm2_tokenizer(args.gguf)
        write_json("smollm2.expected.json", expected(smol, texts, bad))
        f = GGUFReader(args.gguf).fields["tokenizer.chat_template"]
        smollm_template = bytes(f.parts[f.data[0]]).decode("utf-8")
    else:
        print("no GGUF at %s: smollm2 reference not written" % args.gguf, file=sys.stderr)
        smollm_template = json.load(open(os.path.join(OUT, "chat_cases.json")))["templates"]["smollm2"]
    write_json("chat_cases.json", chat_cases(smollm_template), compact=False)
    write_json("nfc.json", nfc_probe())


if __name__ == "__main__":
    main()

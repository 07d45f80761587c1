"""Rendering, tool-call parsing and rewrite classification, on the real SmolLM2 tokenizer."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.gym.models import load_tokenizer
from harnessrl.gym.proxy.canonical import Message, Tool, ToolCall
from harnessrl.gym.proxy.recorder import Branch, classify
from harnessrl.gym.proxy.render import Renderer
from harnessrl.gym.proxy.toolcalls import HermesToolFormat, load_tool_format

TOOLS = [Tool("bash", "run", {"type": "object", "properties": {"command": {"type": "string"}}})]


@pytest.fixture(scope="module")
def r():
    return Renderer(load_tokenizer("tiny-llama"), HermesToolFormat())


def test_template_facts(r):
    assert r.incremental_exact is True
    assert r.bridge_text == "<|im_end|>\n" and r.bridge_ids == [2, 198]
    assert r.stop_token_ids == [2] and len(r.template_hash) == 16


def test_bridge_depends_on_how_the_completion_ended(r):
    assert r.bridge([5, 6, 2], "stop") == [198]      # <|im_end|> was sampled
    assert r.bridge([5, 6], "length") == [2, 198]    # cut by max_tokens: the end token is not sampled
    assert r.bridge([5, 6], "stop") == [2, 198]      # stopped on a stop string


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)
# raw rendered text never holds the private-use characters the content shield borrows
plain_texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",),
                                             exclude_characters="".join(chr(0xF0000 + i) for i in range(64))),
                      min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(user=texts, reply=texts, obs=st.lists(texts, min_size=1, max_size=3), with_call=st.booleans())
def test_incremental_prompt_equals_full_render(r, user, reply, obs, with_call):
    """prev prompt + sampled reply ids + extension == tokens of one full render, whenever the
    policy sampled exactly the template's rendering of its reply."""
    calls = (ToolCall("c1", "bash", json.dumps({"command": reply})),) if with_call else ()
    first = [Message("system", "agent"), Message("user", user)]
    a = Message("assistant", reply, calls)
    new = [Message("tool", o, tool_call_id="c1") for o in obs] if with_call else [Message("user", o) for o in obs]
    prompt = r.full_prompt(first, TOOLS)
    sampled = r.encode_text(r.tool_format.to_template([a], None)[0]["content"]) + [2]
    grown = prompt + sampled + r.extension(sampled, "stop", new, first + [a], TOOLS)
    assert grown == r.full_prompt(first + [a] + new, TOOLS)


def test_extension_tokenizes_only_the_new_messages(r):
    before = r.extension([2], "stop", [Message("user", "hi")], [], [])
    assert r.tok.decode(before) == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("text, calls, flag", [
    ("plain answer", [], None),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', [("bash", {"command": "ls"})], None),
    ('a<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"x\\"}"}</tool_call>'
     '<tool_call>{"name": "bash", "arguments": {}}</tool_call>', [("bash", {"command": "x"}), ("bash", {})], None),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', [("rm", {})], "tool_call_unknown_tool"),
    ('<tool_call>{"name": "bash", "arguments": {"command": "l', [], "tool_call_truncated"),
    ('<tool_call>{"name": bash}</tool_call>', [], "tool_call_bad_json"),
    ('<tool_call>{"arguments": {}}</tool_call>', [], "tool_call_no_name"),
    ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', [], "tool_call_bad_arguments"),
    ('<tool_call>{"name": "bash", "arguments": {}}</tool_call> then <tool_call>{"na', [], "tool_call_truncated"),
])
def test_hermes_parse_never_raises(text, calls, flag):
    p = HermesToolFormat().parse(text, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in p.tool_calls] == calls
    assert p.flag == flag
    if not calls:
        assert p.content == text  # malformed: all of it stays visible as text


def test_tool_results_merge_into_one_user_turn():
    out = HermesToolFormat().to_template([Message("tool", "a", tool_call_id="1"), Message("tool", "b", tool_call_id="2"),
                                          Message("user", "u")], None)
    assert out == [{"role": "user", "content": "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
                                               "</tool_response>"}, {"role": "user", "content": "u"}]


def test_tool_format_registry():
    assert isinstance(load_tool_format("qwen"), HermesToolFormat)
    assert isinstance(load_tool_format("harnessrl.gym.proxy.toolcalls:HermesToolFormat"), HermesToolFormat)
    with pytest.raises(ValueError, match="known: hermes, qwen"):
        load_tool_format("nope")


def test_canonical_keys_ignore_what_does_not_change_tokens():
    a = Message("assistant", " hi \n", (ToolCall("call_1", "bash", '{"command": "ls", "x": 1}'),))
    b = Message("assistant", "hi", (ToolCall("toolu_9", "bash", '{"x":1,"command":"ls"}'),))
    assert a.key() == b.key()
    assert Message("assistant", "hi").key() != Message("assistant", "ho").key()


def _branch(msgs):
    return Branch(0, [], [m.key() for m in msgs], "", [], [], "stop")


def test_classify():
    s, u, a0, o0, a1 = (Message("system", "s"), Message("user", "u"), Message("assistant", "a0"),
                        Message("user", "o0"), Message("assistant", "a1"))
    prev = _branch([s, u, a0, o0, a1])
    k = lambda *ms: [m.key() for m in ms]  # noqa: E731
    assert classify(None, k(s), "") is None
    assert classify(prev, k(s, u, a0, o0), "x") == "tools_changed"
    assert classify(prev, k(s, u, a0, o0), "") == "retry"
    assert classify(prev, k(Message("system", "t"), u), "") == "new_conversation"
    assert classify(prev, k(s, u, a0, o0, Message("assistant", "a1!"), u), "") == "assistant_edited"
    assert classify(prev, k(s, u, a1, Message("user", "new")), "") == "truncation"
    assert classify(prev, k(s, Message("user", "summary")), "") == "summarization"
    assert classify(prev, k(s, Message("user", "u2"), a0, o0, a1, o0), "") == "edited"


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.one_of(plain_texts,
                                st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "\n", " "]),
                                st.builds(lambda t: t * 80, plain_texts)), max_size=12))
def test_piecewise_cached_encoding_equals_the_tokenizer(r, parts):
    text = "".join(parts)
    assert r._split is not None
    assert r.encode(text) == r.encode(text) == r.tok.encode(text, add_special_tokens=False)

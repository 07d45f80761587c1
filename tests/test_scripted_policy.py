"""The scripted policy reads any harness's tool list: it finds the list the proxy rendered by
structure (not the first `<tools>` tag: Copilot CLI's system prompt has a prose `<tools>`
section before it), knows the shell tools the field's harnesses name, and says why when it
finds none. Real parts: the proxy over HTTP on loopback, rendering with tiny-llama's real
tokenizer and chat template, the scripted engine answering /generate."""
from __future__ import annotations

import contextlib
import json

import httpx
import pytest

from harnessrl.gym.doubles.scripted import SHELL_TOOLS, ScriptedEngine, ScriptedPolicy
from harnessrl.gym.models import ModelNotPrepared, load_tokenizer

TASK = "Fix add() in calc.py so that add(2, 2) == 4."
PROSE_TOOLS = ("You are a coding agent.\n<tools>\nYou have tools to read files and run commands. Prefer the\n"
               "shell for builds; never guess file contents.\n</tools>\nBe brief.")


def tool(name: str, arg: str = "command", kind: str = "string", extra: dict | None = None) -> dict:
    props = {arg: {"type": kind} | ({"items": {"type": "string"}} if kind == "array" else {})} | (extra or {})
    return {"type": "function", "function": {"name": name, "description": f"{name} tool",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": [arg, *(extra or {})]}}}


@contextlib.contextmanager
def proxy_over(engine: ScriptedEngine):
    from harnessrl.gym.proxy.config import ProxyConfig
    from harnessrl.gym.proxy.server import ProxyServer
    from harnessrl.gym.served import ServedApp

    with ServedApp(engine.app()) as served, ProxyServer(ProxyConfig(engine_url=served.url, model="tiny-llama")) as p:
        yield p


def ask(proxy, system: str, tools: list[dict]) -> dict:
    sid, key = proxy.open_session({"task_id": "t", "harness": "scripted"})
    r = httpx.post(f"{proxy.openai_base_url(sid)}/chat/completions", timeout=60,
                   headers={"Authorization": f"Bearer {key}"},
                   json={"model": "policy", "tools": tools,
                         "messages": [{"role": "system", "content": system}, {"role": "user", "content": TASK}]})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


@pytest.fixture(scope="module")
def tok():
    try:
        return load_tokenizer("tiny-llama")
    except ModelNotPrepared as e:
        pytest.skip(str(e))


def test_a_prose_tools_section_before_the_rendered_list_does_not_hide_the_tools(tok):
    """Copilot CLI's case: the first `<tools>` of the prompt is the harness's own prose. Before,
    the policy read that block, saw no tools and answered "done" (gold check 9/10)."""
    engine = ScriptedEngine(tok, {TASK: ["sed -i 's/a - b/a + b/' calc.py"]})
    with proxy_over(engine) as proxy:
        msg = ask(proxy, PROSE_TOOLS, [tool("view", "path"), tool("bash")])
    prompt = tok.decode(engine.calls[0].prompt_ids)  # the prose block really comes first
    assert 0 <= prompt.index("<tools>\nYou have tools") < prompt.index('<tools>\n{"type": "function"')
    (call,) = msg["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "sed -i 's/a - b/a + b/' calc.py"}
    assert engine.policy.problems == []


@pytest.mark.parametrize("name,arg,kind,want", [
    ("execute_bash", "command", "string", "echo hi"),          # OpenHands
    ("terminal", "command", "string", "echo hi"),              # Hermes Agent
    ("run_terminal_cmd", "command", "string", "echo hi"),      # Cursor-style agents
    ("execute_command", "command", "string", "echo hi"),       # Cline / Roo
    ("shell", "command", "array", ["bash", "-lc", "echo hi"]),  # Codex's argv shell
    ("run_commands", "commands", "array", ["echo hi"]),         # Cline's list of command lines
    ("project_shell_exec", "script", "string", "echo hi"),     # unknown name, shell-shaped
])
def test_the_shell_tools_of_the_field_are_driven_with_their_own_argument(name, arg, kind, want):
    tools = [tool("read_file", "path")["function"], tool(name, arg, kind, {"reason": {"type": "string"}})["function"]]
    found = ScriptedPolicy.shell_tool(tools)
    assert not isinstance(found, str) and (found[0]["name"], found[1]) == (name, arg)
    text = ScriptedPolicy(tokenizer=None)._call(tools, "echo hi")
    call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call == {"name": name, "arguments": {arg: want, "reason": "scripted step"}}


def test_no_usable_tool_is_said_plainly_and_reaches_check_adapters_report(tok):
    """A harness whose tools hold no shell: the policy answers in plain text (no 500 from the
    engine) and records why, naming the tools it saw; check-adapter prints that line."""
    engine = ScriptedEngine(tok, {TASK: ["echo fix"]})
    with proxy_over(engine) as proxy:
        msg = ask(proxy, "You edit files.", [tool("read_file", "path"), tool("write_file", "path")])
    assert not msg.get("tool_calls") and msg["content"].startswith("I cannot run `echo fix`: no shell tool among")
    (why,) = engine.policy.problems
    assert why.startswith("no shell tool among ['read_file', 'write_file']")
    assert all(n in why for n in SHELL_TOOLS)


def test_a_tools_block_without_definitions_is_reported(tok):
    policy = ScriptedPolicy(tok, {TASK: ["echo fix"]})
    prompt = f"<|im_start|>system\n{PROSE_TOOLS}<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n<|im_start|>assistant\n"
    text, task, step = policy.decide(prompt)
    assert (task, step) == (TASK, 0) and "<tool_call>" not in text
    assert policy.problems == ["a <tools> block in the prompt holds no JSON tool definitions"]

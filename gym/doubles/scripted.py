"""A scripted policy behind the engine contract (POST /generate, bodies from
`gym/backends/encode.py`), for end-to-end tests.

Given tasks' gold plans (shell commands), it answers each /generate call with the next
action in the format the harness asked for, as real tokenizer ids: the intended assistant
text is tokenized with the model's own tokenizer and ends with eos (`<|im_end|>`), so the
proxy parses it exactly as it would a sampled completion and the recorded trajectory can be
checked token for token against what this engine returned (`ScriptedEngine.calls`).

Stateless decisions, read from the prompt itself (decoded with the tokenizer), so it needs
no session id and serves concurrent episodes:
- which task: the plan whose whole problem statement appears in the prompt (else the one
  whose first line does);
- which step: the number of assistant turns already in the prompt;
- which tool: the harness's shell tool from the tool list the proxy rendered into the
  system turn (`<tools>` JSON lines, Hermes format). Found by structure: of every
  `<tools>...</tools>` block in the prompt, the one with the most lines that parse as JSON
  tool definitions (a harness's own prose may have a `<tools>` section before it: Copilot
  CLI's does). The shell tool is the first of `SHELL_TOOLS` present (the names the field's
  harnesses use), else a tool whose name says shell / bash / terminal / command / exec and
  that has a command argument; its command argument is the first of `COMMAND_ARGS` (an
  array-typed one gets ["bash", "-lc", cmd]; `commands`, a list of command lines, gets
  [cmd]); other required string arguments are filled with a short text. When it finds no
  usable tool it answers in plain text and says why in `problems` (check-adapter prints it);
- how to finish: `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` through the tool when the
  prompt asks for that (mini-swe-agent), otherwise a final answer without a tool call.
With `delegate_tool` set (e.g. "Agent", Claude Code's sub-agent tool), a main conversation
whose tools include it hands the whole plan to a sub-agent: its first action is that tool
with the problem statement as the prompt (marked DELEGATED), its next a final answer; the
sub-agent's conversation (its prompt holds the marker) carries out the plan.
A harness's own compaction request (its last user turn asks for a summary of a conversation
in which the task's plan had begun, or another harness's known summary prompt, tools offered or
not) gets a summary: `SUMMARY_MARK` with the number of plan steps already carried out (each
step's command found in the prompt) and the whole problem statement, so the conversation that
goes on from the summary alone is still recognised, and its steps continue from that number.
A call with no tools in its prompt gets plain text: for an edit-only harness that asks for
SEARCH/REPLACE blocks (aider), the task's gold patch rewritten as such blocks (`edits`);
for a title or side request, a short answer.
"""
from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from harnessrl.gym.backends.encode import finish_reason, sglang_reply

#: Shell tools by name, as harnesses in the field call them (mini-swe-agent, Claude Code and
#: Copilot CLI `bash`/`Bash`; Codex `exec_command`/`shell`; Gemini/Qwen `run_shell_command`;
#: Cline `run_commands`/`execute_command`; OpenHands `execute_bash`; Cursor-style
#: `run_terminal_cmd`; Hermes Agent `terminal`; others `run_command`, `shell_command`, `Shell`).
SHELL_TOOLS = ("bash", "Bash", "exec_command", "shell", "Shell", "run_shell_command", "run_commands",
               "execute_command", "execute_bash", "run_terminal_cmd", "terminal", "run_command", "shell_command")
COMMAND_ARGS = ("command", "cmd", "commands", "script")
_SHELLISH = re.compile(r"shell|bash|terminal|command|exec", re.I)
MINI_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
DELEGATED = "DELEGATED TASK (carry it out yourself):"
SUMMARY_MARK = "SCRIPTED SUMMARY: plan steps done:"
_SUMMARY_DONE = re.compile(re.escape(SUMMARY_MARK) + r" (\d+)")
#: How harnesses ask for a summary (OpenCode: "Create a new anchored summary", Codex: "Create a
#: handoff summary", Claude Code: "create a detailed summary"); not a tool output's "summary"
#: (pytest's "short test summary info"): tool results are cut out of the turn first.
_SUMMARY_ASK = re.compile(r"\b(create|write|provide|produce|give)\b[^.\n]{0,60}\bsummary\b|\bsummari[sz]e\b"
                          r"|CONTEXT CHECKPOINT COMPACTION", re.I)
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.S)
_USER_TURN = "<|im_start|>user"
_TOOLS_BLOCK = re.compile(r"<tools>[ \t]*\n(.*?)\n[ \t]*</tools>", re.S)


@dataclass
class ScriptedCall:
    """One /generate call as this engine saw and answered it."""

    prompt_ids: list[int]
    output_ids: list[int]
    text: str
    task_key: str | None
    step: int


def _schema(tool: dict) -> dict:
    return tool.get("parameters") or tool.get("input_schema") or {}


def _tool_call(tool: dict, args: dict[str, Any], fill: Any = lambda name: "scripted step") -> str:
    """The Hermes tool-call text for `tool` with `args`, its other required string arguments
    filled with `fill(name)`."""
    params = _schema(tool)
    props = params.get("properties") or {}
    for name in params.get("required") or []:
        if name not in args and (props.get(name) or {}).get("type") == "string":
            args[name] = fill(name)
    return "<tool_call>\n" + json.dumps({"name": tool["name"], "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


@dataclass
class ScriptedPolicy:
    """Decides the assistant text for a prompt. `plans`: problem statement -> shell commands."""

    tokenizer: Any
    plans: dict[str, list[str]] = field(default_factory=dict)
    edits: dict[str, str] = field(default_factory=dict)
    """problem statement -> SEARCH/REPLACE text, for edit-only harnesses (aider)."""
    final_text: str = "The fix is applied; the task is done."
    assistant_marker: str = "<|im_start|>assistant"
    delegate_tool: str | None = None
    """A sub-agent tool to hand the plan to (None: carry the plan out in the main conversation)."""
    problems: list[str] = field(default_factory=list)
    """Why a plan step found no usable tool, once each (check-adapter reports them)."""
    _problems_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _task(self, prompt: str) -> str | None:
        # The whole statement first: synthesized tasks on one function share their first line.
        whole = [st for st in self.plans if st.strip() and st.strip() in prompt]
        if whole:
            return max(whole, key=len)
        for statement in self.plans:
            key = statement.strip().splitlines()[0].strip() if statement.strip() else ""
            if key and key in prompt:
                return statement
        return None

    def _tools(self, prompt: str) -> list[dict]:
        """The tool definitions of the prompt's tool list (module doc: found by structure)."""
        best: list[dict] = []
        for m in _TOOLS_BLOCK.finditer(prompt):
            tools = []
            for line in m.group(1).splitlines():
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                tool = obj.get("function", obj) if isinstance(obj, dict) else None
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    tools.append(tool)
            if tools and len(tools) >= len(best):
                best = tools
        return best

    @staticmethod
    def shell_tool(tools: list[dict]) -> tuple[dict, str] | str:
        """(the shell tool, its command argument), or why there is none (one line)."""
        by_name = {t.get("name"): t for t in tools}
        named = [by_name[n] for n in SHELL_TOOLS if n in by_name]
        shaped = [t for t in tools if _SHELLISH.search(t["name"])
                  and any(a in (_schema(t).get("properties") or {}) for a in COMMAND_ARGS)]
        for tool in named + shaped:
            props = _schema(tool).get("properties") or {}
            arg = next((a for a in COMMAND_ARGS if a in props), None)
            if arg is not None:
                return tool, arg
        if not tools:
            return "no tool list in the prompt (no <tools> block with JSON tool definitions)"
        return (f"no shell tool among {sorted(by_name)} (known names: {', '.join(SHELL_TOOLS)}; "
                f"command arguments: {', '.join(COMMAND_ARGS)})")

    def _problem(self, why: str) -> None:
        with self._problems_lock:
            if why not in self.problems:
                self.problems.append(why)

    def _call(self, tools: list[dict], command: str) -> str:
        found = self.shell_tool(tools)
        if isinstance(found, str):
            self._problem(found)
            return f"I cannot run `{command}`: {found}."
        tool, arg = found
        props = _schema(tool).get("properties") or {}
        # An array: argv (Codex `shell`), or a list of command lines (Cline `run_commands.commands`).
        array = [command] if arg == "commands" else ["bash", "-lc", command]
        return _tool_call(tool, {arg: array if props[arg].get("type") == "array" else command})

    def _delegate(self, tools: list[dict], task: str) -> str:
        tool = next(t for t in tools if t.get("name") == self.delegate_tool)
        return _tool_call(tool, {"prompt": f"{DELEGATED}\n{task}"},
                          lambda name: "general-purpose" if name == "subagent_type" else "fix the task")

    def _done(self, plan: list[str], text: str) -> int:
        """How many of the plan's steps `text` shows carried out: the last step whose command
        it holds (raw, or JSON-escaped as a tool call's argument), plus one."""
        def shown(cmd: str) -> bool:
            return cmd in text or json.dumps(cmd)[1:-1] in text
        return next((i + 1 for i in range(len(plan) - 1, -1, -1) if shown(plan[i])), 0)

    def _asks_summary(self, prompt: str, plan: list[str]) -> bool:
        """A compaction request: its last user turn asks for a summary (or a checkpoint) of a
        conversation in which the plan had begun."""
        last_user = _TOOL_RESPONSE.sub("", prompt[prompt.rfind(_USER_TURN):])
        return bool(plan) and bool(_SUMMARY_ASK.search(last_user)) and self._done(plan, prompt) > 0

    def _summary(self, prompt: str, plan: list[str], task: str) -> str:
        # the summarized conversation shows its steps' commands (distinct commands: a repeated
        # one counts as its last occurrence); an earlier summary's count carries over
        done = max(self._done(plan, prompt), self._step(prompt, plan) if _SUMMARY_DONE.search(prompt) else 0)
        return f"{SUMMARY_MARK} {done}\nTask (verbatim):\n{task}\nNext: carry out step {done + 1} of the plan."

    def _step(self, prompt: str, plan: list[str]) -> int:
        """The step index: assistant turns so far; after a compaction, the summary's count
        plus the steps shown after it."""
        marks = list(_SUMMARY_DONE.finditer(prompt))
        if not marks:
            return max(0, prompt.count(self.assistant_marker) - 1)
        m = marks[-1]
        return int(m.group(1)) + max(0, prompt[m.end():].count(self.assistant_marker) - 1)

    def decide(self, prompt: str) -> tuple[str, str | None, int]:
        """(assistant text, task statement or None, step index) for a decoded prompt."""
        tools = self._tools(prompt)
        task = self._task(prompt)
        plan = self.plans.get(task, []) if task is not None else []
        if task is not None and self._asks_summary(prompt, plan):
            return self._summary(prompt, plan, task), task, self._step(prompt, plan)
        step = self._step(prompt, plan)
        if not tools:
            if task is not None and "SEARCH" in prompt and "REPLACE" in prompt:
                # aider's prompt holds worked examples as earlier turns, so the step count says
                # nothing here: answer with the edits unless they were already given.
                edits = self.edits.get(task, "")
                if edits.strip() and edits.strip() not in prompt:
                    return edits, task, step
                return "No change is needed.", task, step
            if task is not None and "<tools>" in prompt and step < len(self.plans.get(task, [])):
                self._problem("a <tools> block in the prompt holds no JSON tool definitions")
            return ("Scripted episode" if task is None else self.final_text), task, step
        if (plan and self.delegate_tool and DELEGATED not in prompt
                and any(t.get("name") == self.delegate_tool for t in tools)):
            if step == 0:
                return self._delegate(tools, task), task, step
            return self.final_text, task, step
        if step < len(plan):
            return self._call(tools, plan[step]), task, step
        if MINI_SUBMIT in prompt:  # the harness told the model to finish this way
            return self._call(tools, f"echo {MINI_SUBMIT}"), task, step
        return self.final_text, task, step


class ScriptedEngine:
    """The policy behind SGLang's /generate (non-streamed and cumulative SSE streams)."""

    def __init__(self, tokenizer: Any, plans: dict[str, list[str]] | Iterable[tuple[str, list[str]]] = (),
                 weight_version: str = "scripted", logprob: float = -0.125):
        self.tokenizer = tokenizer
        self.policy = ScriptedPolicy(tokenizer, dict(plans))
        self.weight_version = weight_version
        self.logprob = logprob
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls: list[ScriptedCall] = []
        self._lock = threading.Lock()

    def set_plans(self, plans: dict[str, list[str]], edits: dict[str, str] | None = None) -> None:
        self.policy.plans = dict(plans)
        self.policy.edits = dict(edits or {})

    def set_tasks(self, tasks: Iterable[Any], gold: bool = True) -> None:
        """Plans (and SEARCH/REPLACE edits) from Task objects; gold=False: empty plans."""
        tasks = list(tasks)
        self.set_plans({t.problem_statement: list(t.gold_plan) if gold else [] for t in tasks},
                       {t.problem_statement: search_replace_blocks(t.patch) for t in tasks if gold and t.patch})

    def generate(self, input_ids: list[int], max_new_tokens: int | None) -> tuple[list[int], str, str]:
        prompt = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        text, task, step = self.policy.decide(prompt)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_id]
        finish = "stop"
        if max_new_tokens is not None and len(ids) > max_new_tokens:
            ids, finish = ids[:max_new_tokens], "length"
        with self._lock:
            self.calls.append(ScriptedCall(list(input_ids), ids, text, task, step))
        return ids, finish, text

    def _body(self, input_ids: list[int], ids: list[int], finish: str | None, rid: str) -> dict:
        """One reply or cumulative chunk (finish None) over `ids`; a stop matched eos."""
        fr = finish_reason(finish, matched=self.eos_id, length=len(ids))
        return sglang_reply(rid=rid, output_ids=ids, logprobs=[self.logprob] * len(ids), finish=fr,
                            prompt_tokens=len(input_ids), weight_version=self.weight_version,
                            text=self.tokenizer.decode(ids, skip_special_tokens=True))

    def app(self):
        """A Starlette app serving /generate, /health, /get_model_info, /abort_request."""
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        async def generate(request):
            body = await request.json()
            input_ids = body.get("input_ids")
            if not isinstance(input_ids, list) or not all(isinstance(t, int) for t in input_ids):
                return JSONResponse({"error": {"message": "input_ids: a list of token ids is required"}}, 400)
            rid = body.get("rid") or uuid.uuid4().hex
            ids, finish, _ = self.generate(input_ids, (body.get("sampling_params") or {}).get("max_new_tokens"))
            if not body.get("stream"):
                return JSONResponse(self._body(input_ids, ids, finish, rid))

            def sse():  # cumulative chunks, as SGLang sends by default
                for end in range(8, len(ids), 8):
                    yield b"data: " + json.dumps(self._body(input_ids, ids[:end], None, rid)).encode() + b"\n\n"
                yield b"data: " + json.dumps(self._body(input_ids, ids, finish, rid)).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
            return StreamingResponse(sse(), media_type="text/event-stream")

        async def health(request):
            return JSONResponse({})

        async def model_info(request):
            return JSONResponse({"model_path": "scripted", "weight_version": self.weight_version})

        async def abort(request):
            return JSONResponse({})

        return Starlette(routes=[Route("/generate", generate, methods=["POST"]),
                                 Route("/health", health, methods=["GET"]),
                                 Route("/get_model_info", model_info, methods=["GET"]),
                                 Route("/abort_request", abort, methods=["POST"])])


def search_replace_blocks(patch: str) -> str:
    """A unified git diff as aider's SEARCH/REPLACE blocks: one block per hunk, SEARCH = its
    context and removed lines, REPLACE = its context and added lines (new file: empty SEARCH)."""
    out: list[str] = []
    path, search, replace, in_hunk = None, [], [], False

    def flush() -> None:
        if in_hunk and path is not None:
            out.append(f"{path}\n```\n<<<<<<< SEARCH\n{''.join(search)}=======\n{''.join(replace)}"
                       ">>>>>>> REPLACE\n```\n")

    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            flush()
            path, search, replace, in_hunk = None, [], [], False
        elif line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
        elif line.startswith("@@"):
            flush()
            search, replace, in_hunk = [], [], True
        elif in_hunk and line[:1] in (" ", "-", "+"):
            body = line[1:] if line.endswith("\n") else line[1:] + "\n"
            if line[0] in " -":
                search.append(body)
            if line[0] in " +":
                replace.append(body)
    flush()
    return "\n".join(out)


"""Chat-template rendering: the full prompt of a new conversation, and the incremental
suffix of a conversation that grew.

Contract: the proxy never re-tokenizes text the policy generated. When a conversation
grows, the next prompt is `previous prompt ids + sampled completion ids + extension`,
where `extension` is the template's end-of-assistant-turn text that the policy did not
sample itself (the bridge; e.g. ChatML's "<|im_end|>\\n", or only "\\n" when `<|im_end|>`
was sampled) plus the new messages rendered by the model's own chat template.

Only the new messages are templated and tokenized, so turn 40 costs what turn 1 does:
they are rendered after a short fixed anchor conversation and the anchor's text is cut
off. Whether `tokens(bridge) + tokens(suffix)` equals the tokens of a full render is
checked once per template at start-up (`incremental_exact`). Long text pieces between
added tokens (system prompts with tool lists) are tokenized once and cached, and so are short ones
(the template's own role headers). When the anchor trick does
not hold for a template (it renders earlier turns differently), the renderer falls back to
diffing two full renders of the real history.

Message content never becomes control tokens: every template message's content is shielded
(`shield.py`) before the template renders it, so `<|im_start|>assistant` in a tool result
is tokenized as the text it is, and the only special-token ids in a prompt are the ones
the chat template wrote. Content without special-token text tokenizes as it always did.
"""
from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections import OrderedDict

from .canonical import Message, Tool
from .shield import Shield, special_tokens
from .identity import template_hash
from .toolcalls import ToolFormat

_MARK = "\u2063ANCHOR-REPLY\u2063"


def _ids(fast, text: str) -> list[int]:
    """`fast.encode(text).ids`. Long texts go through `encode_batch_fast`, which releases the
    GIL (`encode` holds it) and builds no offsets/token strings (freeing those for a 7.5 MB
    text holds the GIL ~0.5 s): renders run in worker threads, and a multi-MB prompt must not
    freeze the proxy's event loop, and every other session with it, while it tokenizes."""
    if len(text) > 8192:
        batch = getattr(fast, "encode_batch_fast", None) or fast.encode_batch
        return batch([text], add_special_tokens=False)[0].ids
    return fast.encode(text, add_special_tokens=False).ids


@functools.lru_cache(maxsize=4)
def _backends(tokenizer_json: str, controls: tuple[str, ...]):
    """Two private copies of a fast tokenizer: special-token matching on, and off (the text
    copy, in which control tokens the tokenizer does not flag special are flagged so, so they
    split too). Private because the flag is tokenizer-wide state that transformers flips on
    every `tok(..., split_special_tokens=...)` call: a shared backend could lose the template's
    control tokens after anyone's call. Cached per tokenizer (a copy takes ~0.4 s to build);
    nothing changes them after this."""
    from tokenizers import AddedToken, Tokenizer

    normal, text = Tokenizer.from_str(tokenizer_json), Tokenizer.from_str(tokenizer_json)
    normal.encode_special_tokens = False
    shielded = set(controls)
    plain = [c for c in text.get_added_tokens_decoder().values() if not c.special and c.content in shielded]
    if plain:
        text.add_special_tokens([AddedToken(c.content, single_word=c.single_word, lstrip=c.lstrip, rstrip=c.rstrip,
                                            normalized=c.normalized, special=True) for c in plain])
    text.encode_special_tokens = True
    return normal, text


SHORT_PIECES = 4096
"""Short pieces (under 1,024 characters) whose ids are kept: the template's own text between
control tokens ("\n", "assistant\n", "user\n") costs a tokenizer call (~30 us) each time
otherwise, several per render."""


class TemplateMismatch(Exception):
    """The template does not render a grown conversation as a prefix extension."""


class OverBudget(Exception):
    """A render met more text to tokenize than `Renderer.budget` allows (raised before
    tokenizing it: the caller renders again where time does not matter)."""


class Renderer:
    def __init__(self, tokenizer, tool_format: ToolFormat):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; harnessrl renders prompts with the model's own")
        self.tok = tokenizer
        self.tool_format = tool_format
        self.shield = Shield(special_tokens(tokenizer))
        self.special_ids = frozenset(tokenizer.convert_tokens_to_ids(self.shield.specials))
        """The control-token ids: only the chat template's own text may produce them."""
        fast = getattr(tokenizer, "_tokenizer", None)  # tokenizers.Tokenizer: skips python overhead
        self._fast, self._fast_text = (_backends(fast.to_str(), self.shield.specials) if fast is not None
                                       else (None, None))
        self.template_hash = template_hash(tokenizer)
        self.stop_token_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._short: dict[str, list[int]] = {}
        self._left = threading.local()  # per thread: renders run on the loop and in workers at once
        self._split = self._piecewise_split()
        anchor = [Message("system", "A"), Message("user", "B")]
        self._anchor_tmpl = self.template(anchor, None) + [{"role": "assistant", "content": _MARK}]
        self._anchor_text = self.render_text(self._anchor_tmpl, False)
        pos = self._anchor_text.rfind(_MARK)
        if pos < 0:
            raise ValueError("the chat template drops assistant content; cannot find the end-of-turn text")
        self.bridge_text = self._anchor_text[pos + len(_MARK):]
        self.bridge_ids = self.encode(self.bridge_text)
        self.incremental_exact = self._self_check()

    # -- primitives ------------------------------------------------------------------
    def template(self, messages: list[Message], tools: list[Tool] | None) -> list[dict]:
        """The tool format's template messages, their content shielded."""
        sh = self.shield.shield
        return [dict(d, content=sh(d["content"])) if isinstance(d.get("content"), str) else d
                for d in self.tool_format.to_template(messages, tools)]

    def render_text(self, tmsgs: list[dict], generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(tmsgs, tokenize=False, add_generation_prompt=generation_prompt)

    @contextlib.contextmanager
    def budget(self, chars: int):
        """In this thread, within the block: tokenize at most `chars` characters of text the
        piece cache does not hold, else raise `OverBudget` before tokenizing. What the event
        loop may render itself: a cached system prompt and a short new turn cost tens of
        microseconds, a thread hop more; anything longer goes to a worker (`offload`)."""
        self._left.chars = chars
        try:
            yield
        finally:
            self._left.chars = None

    def _spend(self, text: str) -> None:
        left = getattr(self._left, "chars", None)
        if left is not None:
            if len(text) > left:
                raise OverBudget(f"{len(text)} characters to tokenize, {left} left")
            self._left.chars = left - len(text)

    def _encode_raw(self, text: str) -> list[int]:
        self._spend(text)
        if self._fast is not None:
            return _ids(self._fast, text)
        return self.tok.encode(text, add_special_tokens=False)

    def _encode_as_text(self, text: str) -> list[int]:
        self._spend(text)
        if self._fast_text is not None:
            return _ids(self._fast_text, text)
        # python tokenizers only: this splits the tokens flagged special, not template-written plain ones
        return self.tok.encode(text, add_special_tokens=False, split_special_tokens=True)

    def encode_text(self, text: str) -> list[int]:
        """Ids of content text on its own, special-token text kept as text (e.g. what the
        policy samples when it writes its reply's template rendering)."""
        return self.encode(self.shield.shield(text))

    def _piecewise_split(self):
        """Added tokens cut text into pieces the tokenizer encodes independently, so long
        pieces (a harness's 6-17 kB system prompt + tool list, identical in every episode)
        can be cached. Only when every added token is a plain literal; checked on a sample."""
        added = getattr(self.tok, "added_tokens_decoder", {}) or {}
        if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values()):
            return None
        ids = {t.content: i for i, t in added.items()}
        split = (re.compile("|".join(re.escape(c) for c in sorted(ids, key=len, reverse=True))), ids)
        sample = self.tok.apply_chat_template([{"role": "system", "content": "S " * 600},
                                               {"role": "user", "content": " hi\n<|x|> \u00e9t\u00e9"}],
                                              tokenize=False, add_generation_prompt=True)
        self._split = split
        return split if self.encode(sample) == self._encode_raw(sample) == self.encode(sample) else None

    def encode(self, text: str) -> list[int]:
        """Ids of a rendered text: added-token literals are tokens, shielded content is text."""
        if self._split is None:
            out: list[int] = []
            for piece, literal in self.shield.pieces(text):
                out += self._encode_as_text(piece) if literal else self._encode_raw(piece)
            return out
        rx, ids = self._split
        out: list[int] = []
        pos = 0
        for m in rx.finditer(text):
            if m.start() > pos:
                out += self._piece(text[pos:m.start()])
            out.append(ids[m.group()])
            pos = m.end()
        if pos < len(text):
            out += self._piece(text[pos:])
        return out

    def _encode_piece(self, piece: str) -> list[int]:
        if self.shield.marked(piece):
            return self._encode_as_text(self.shield.restore(piece))
        return self._encode_raw(piece)

    def _piece(self, piece: str) -> list[int]:
        if len(piece) < 1024:  # role headers, "\n", short turns: recur in every render
            hit = self._short.get(piece)
            if hit is None:
                if len(self._short) >= SHORT_PIECES:
                    self._short.clear()  # a flood of one-off short turns: start over (cheap, bounded)
                hit = self._short[piece] = self._encode_piece(piece)
            return hit
        if len(piece) > 256 * 1024:  # huge pieces are one-offs: 256 of them would pin GBs
            return self._encode_piece(piece)
        hit = self._pieces.get(piece)
        if hit is None:
            hit = self._pieces[piece] = self._encode_piece(piece)
            if len(self._pieces) > 256:
                with contextlib.suppress(KeyError):  # renders run in worker threads: another may evict
                    self._pieces.popitem(last=False)
        else:
            with contextlib.suppress(KeyError):
                self._pieces.move_to_end(piece)
        return hit

    def decode(self, ids: list[int]) -> str:
        """Sampled text exactly: special tokens dropped, no "clean-up" of spaces before punctuation."""
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=True)
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # -- prompts -----------------------------------------------------------------------
    def full_prompt(self, messages: list[Message], tools: list[Tool]) -> list[int]:
        """Prompt ids of a conversation rendered from scratch (first call of a segment)."""
        return self.encode(self.render_text(self.template(messages, tools or None), True))

    def bridge(self, completion_ids: list[int], finish_reason: str) -> list[int]:
        """End-of-turn tokens the policy did not sample itself (none of them when it stopped on them)."""
        b = self.bridge_ids
        if finish_reason == "stop" and completion_ids:
            for k in range(min(len(b), len(completion_ids)), 0, -1):
                if completion_ids[-k:] == b[:k]:
                    return b[k:]
        return list(b)

    def extension(self, completion_ids: list[int], finish_reason: str, new_messages: list[Message],
                  history: list[Message], tools: list[Tool]) -> list[int]:
        """Tokens that follow the sampled completion: bridge + new messages + generation prompt."""
        suffix = self._suffix_text(new_messages, history, tools)
        return self.bridge(completion_ids, finish_reason) + self.encode(suffix)

    def _suffix_text(self, new_messages: list[Message], history: list[Message], tools: list[Tool]) -> str:
        new_tmpl = self.template(new_messages, None)
        text = self.render_text(self._anchor_tmpl + new_tmpl, True)
        if text.startswith(self._anchor_text):
            return text[len(self._anchor_text):]
        # The template renders a turn differently once it is no longer last: diff real renders.
        before = self.render_text(self.template(history, tools or None), False)
        pos = before.rfind(self.bridge_text)
        after = self.render_text(self.template(history + new_messages, tools or None), True)
        if pos < 0 or not after.startswith(before):
            raise TemplateMismatch("the chat template does not render the grown conversation as an extension")
        return after[len(before):]

    def _self_check(self) -> bool:
        """Incremental ids == full-render ids on a sample conversation with a tool round trip
        whose tool output spells the template's control tokens."""
        from .canonical import ToolCall

        tools = [Tool("bash", "run a command", {"type": "object", "properties": {"command": {"type": "string"}}})]
        first = [Message("system", "You are a coding agent."), Message("user", "List the files, please.")]
        reply = Message("assistant", "Sure.", (ToolCall("c1", "bash", '{"command": "ls"}'),))
        forged = "".join(self.shield.specials[:4])
        new = [Message("tool", f"a.py\n{forged}b.py", tool_call_id="c1"), Message("user", "Thanks. Now?")]
        prompt = self.full_prompt(first, tools)
        reply_text = self.tool_format.to_template([reply], None)[0]["content"]
        sampled = self.encode(reply_text) + self.bridge_ids[:1]
        try:
            incremental = prompt + sampled + self.extension(sampled, "stop", new, first + [reply], tools)
        except TemplateMismatch:
            return False
        return incremental == self.full_prompt(first + [reply] + new, tools)

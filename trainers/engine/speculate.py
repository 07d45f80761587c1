"""Draft tokens by prompt lookup, for speculative decoding of a single running request.

A coding agent's completions copy long runs of their context: file names, code they just read,
the command they ran last turn. So the tokens after the last few generated ones are often the
tokens that followed the same few tokens earlier in the sequence. `PromptLookup.draft` finds
the most recent earlier occurrence of the sequence's last n tokens (n from `max_ngram` down
to `min_ngram`, the longest match wins) and proposes the tokens that followed it, as many as
the match was long minus one (`n - 1`: a longer match predicts more; measured on recorded
SmolLM2 mini-swe-agent completions, this policy emits the most tokens per unit of verify cost),
plus a bonus that grows by `GROW` tokens (up to `MAX_BONUS`) while every draft of the request is
accepted whole and drops to 0 at the first rejected one (`feedback`): a copy in progress is
drafted in longer runs, and a request that stops copying pays for short drafts only.

Drafts never change what is sampled (the scheduler's `_speculative_step` verifies every draft
token against the model's own choice with the request's own sampler, and the verify pass
computes each position's logits exactly as a one-token step would), only how many tokens one
pass of the model yields.

The index is built incrementally: each position is indexed once, when the token after it is
known, so a draft costs a few dict lookups however long the context is.
"""
from __future__ import annotations

MAX_NGRAM = 6
MIN_NGRAM = 2
GROW = 2
MAX_BONUS = 10


class PromptLookup:
    """The n-gram index of one request's sequence (prompt, then its output as it grows)."""

    def __init__(self, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_n, self.min_n = max_ngram, min_ngram
        self.bonus = 0
        self._seen: list[int] = []  # prompt + output as indexed so far
        self._n_prompt = -1
        # n -> {n-gram: end of its latest occurrence that has a next token}
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}

    def _extend(self, prompt: list[int], output: list[int]) -> None:
        """Index what is new in prompt + output since the last call: O(new tokens), not O(context)
        (a request's prompt is fixed and its output only grows; anything else starts over)."""
        seen = self._seen
        n_out = len(seen) - self._n_prompt
        if (len(prompt) != self._n_prompt or len(output) < n_out
                or (seen and (output[n_out - 1] if n_out else prompt[-1]) != seen[-1])):
            seen = self._seen = list(prompt)
            self._n_prompt, n_out = len(prompt), 0
            for table in self._index.values():
                table.clear()
            start = 0
        else:
            start = len(seen)
        seen.extend(output[n_out:])
        # the n-gram seen[end - n:end] is indexed once its next token seen[end] exists
        for end in range(max(start, 1), len(seen)):
            for n, table in self._index.items():
                if end >= n:
                    table[tuple(seen[end - n:end])] = end

    def draft(self, prompt: list[int], output: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens proposed to follow prompt + output (empty: no earlier occurrence of
        its tail)."""
        self._extend(prompt, output)
        if limit <= 0:
            return []
        seen = self._seen
        for n in range(min(self.max_n, len(seen)), self.min_n - 1, -1):
            e = self._index[n].get(tuple(seen[-n:]))
            if e is not None:
                return seen[e:e + min(limit, n - 1 + self.bonus)]
        return []

    def feedback(self, drafted: int, accepted: int) -> None:
        """How the last draft fared: all accepted grows the next drafts, any rejection resets."""
        self.bonus = min(self.bonus + GROW, MAX_BONUS) if accepted == drafted else 0

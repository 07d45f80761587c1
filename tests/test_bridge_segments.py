"""trainers/bridges/segments.py: a record's segments as (prompt, response, mask, logprobs)
rows, the segment policies with their dropped-token counts, and truncation, on a
hand-built record whose every number is checked."""
from __future__ import annotations

import pytest

from harnessrl.gym.trajectory import CallRecord, Segment, Trajectory
from harnessrl.trainers.bridges.segments import segment_rows, select, truncate


def _call(cid, seg, prefix, new, out, lp, version):
    return CallRecord(call_id=cid, session_id="s", index=int(cid[1:]), dialect="openai-chat", prompt_prefix_len=prefix,
                      new_prompt_ids=new, completion_ids=out, logprobs=[lp] * len(out),
                      versions=[version] * len(out), finish_reason="stop", segment=seg)


def _record(final_segment: int = 0) -> Trajectory:
    """Segment 0: prompt [1,2,3], sampled [10,11], env [4,5], sampled [12,13,14] (+ [6], [15] when it
    is extended last); segment 1 (a rewrite): prompt [1,7], sampled [20]."""
    calls = [_call("c0", 0, 0, [1, 2, 3], [10, 11], -0.5, 3), _call("c1", 0, 5, [4, 5], [12, 13, 14], -0.25, 4),
             _call("c2", 1, 0, [1, 7], [20], -1.0, 4)]
    s0 = Segment([1, 2, 3, 10, 11, 4, 5, 12, 13, 14], [0, 0, 0, 1, 1, 0, 0, 1, 1, 1],
                 [0.0, 0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.25, -0.25, -0.25], [-1, -1, -1, 3, 3, -1, -1, 4, 4, 4])
    if final_segment == 0:  # a side call went to segment 1; the main conversation goes on in segment 0
        calls.append(_call("c3", 0, 10, [6], [15], -2.0, 5))
        s0 = Segment(s0.token_ids + [6, 15], s0.loss_mask + [0, 1], s0.logprobs + [0.0, -2.0], s0.versions + [-1, 5])
    s1 = Segment([1, 7, 20], [0, 0, 1], [0.0, 0.0, -1.0], [-1, -1, 4], split_reason="summarization")
    return Trajectory("s", [s0, s1], reward=1.0, status="ok", calls=calls)


def test_rows_are_the_first_prompt_then_everything_after_it():
    r0, r1 = segment_rows(_record(final_segment=1))
    assert r0.prompt_ids == [1, 2, 3]
    assert r0.response_ids == [10, 11, 4, 5, 12, 13, 14]
    assert r0.response_mask == [1, 1, 0, 0, 1, 1, 1]
    assert r0.response_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.25, -0.25, -0.25]
    assert r0.versions == [3, 3, -1, -1, 4, 4, 4]
    assert (r0.sampled_tokens, r0.num_calls, r0.min_version, r0.max_version) == (5, 2, 3, 4)
    assert (r1.prompt_ids, r1.response_ids, r1.response_mask, r1.split_reason) == ([1, 7], [20], [1], "summarization")


def test_policies_and_dropped_tokens():
    rows = segment_rows(_record(final_segment=1))
    kept, dropped = select(rows, "longest")
    assert [r.segment for r in kept] == [0] and dropped == 1
    kept, dropped = select(rows, "last", _record(final_segment=1))
    assert [r.segment for r in kept] == [1] and dropped == 5
    kept, dropped = select(rows, "all")
    assert [r.segment for r in kept] == [0, 1] and dropped == 0
    # the harness went back to segment 0 after a side call: "last" follows the final call
    t = _record(final_segment=0)
    kept, dropped = select(segment_rows(t), "last", t)
    assert [r.segment for r in kept] == [0] and dropped == 1
    with pytest.raises(ValueError, match="segment_policy: 'first' is not one of longest, last, all"):
        select(rows, "first")


def test_a_tie_goes_to_the_later_segment_and_empty_rows_are_never_kept():
    t = _record(final_segment=1)
    t.segments[1] = Segment([1, 7, 20, 21, 22, 23, 24], [0, 0, 1, 1, 1, 1, 1], [0.0, 0.0] + [-1.0] * 5,
                            [-1, -1] + [4] * 5, split_reason="summarization")
    t.calls[2].completion_ids = [20, 21, 22, 23, 24]
    kept, dropped = select(segment_rows(t), "longest")
    assert [r.segment for r in kept] == [1] and dropped == 5
    assert select([], "longest") == ([], 0)


def test_truncate_counts_what_it_cuts():
    r0 = segment_rows(_record(final_segment=1))[0]
    short, cut, sampled_cut = truncate(r0, 4)
    assert (short.response_ids, short.response_mask, cut, sampled_cut) == ([10, 11, 4, 5], [1, 1, 0, 0], 3, 3)
    assert short.response_logprobs == [-0.5, -0.5, 0.0, 0.0] and short.versions == [3, 3, -1, -1]
    assert truncate(r0, 7) == (r0, 0, 0)


def test_a_segment_that_does_not_start_with_its_first_prompt_is_refused():
    t = _record(final_segment=1)
    t.calls[0].new_prompt_ids = [1, 2, 9]
    with pytest.raises(ValueError, match="segment 0: does not start with the prompt of its first call c0"):
        segment_rows(t)

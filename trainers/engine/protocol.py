"""Request bodies of the engine's HTTP API, validated with pydantic.

Field names and defaults follow SGLang's `GenerateReqInput` / `SamplingParams`
(io_struct.py, sampling_params.py), restricted to what the local engine implements.
Parameters SGLang has but this engine does not implement are accepted only at their
neutral value, so a client never silently gets different sampling than it asked for.
Every validation failure becomes one 400 whose message names the field
(`sampling_params.max_new_tokens: ...`).
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

TokenId = Annotated[StrictInt, Field(ge=0)]

#: SGLang sampling parameters the local engine does not implement, with their neutral value.
UNSUPPORTED_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "min_new_tokens": 0,
    "n": 1,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
    "custom_params": None,
}


class SamplingParams(BaseModel):
    """The subset of SGLang's SamplingParams the local engine implements."""

    model_config = ConfigDict(extra="allow")

    max_new_tokens: StrictInt = Field(128, ge=0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = -1
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    sampling_seed: StrictInt | None = None

    @model_validator(mode="after")
    def _check(self) -> "SamplingParams":
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"@top_k: must be -1 (disabled) or at least 1, got {self.top_k}")
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED_NEUTRAL:
                if value != UNSUPPORTED_NEUTRAL[name]:
                    raise ValueError(f"@{name}: {value!r} is not supported by the local engine "
                                     f"(only {UNSUPPORTED_NEUTRAL[name]!r})")
            else:
                raise ValueError(f"@{name}: unknown sampling parameter")
        return self

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


class GenerateRequest(BaseModel):
    """POST /generate for one prompt (a batch is split into these by `split_batch`)."""

    model_config = ConfigDict(extra="ignore")

    input_ids: list[TokenId] = Field(min_length=1)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    rid: str | None = None
    stream: StrictBool = False
    return_logprob: StrictBool = False
    logprob_start_len: StrictInt = -1
    top_logprobs_num: StrictInt = Field(0, ge=0, le=50)
    return_text_in_logprobs: StrictBool = False
    priority: StrictInt | None = None
    """Admission order when requests wait for a batch slot: higher first (SGLang's
    `--enable-priority-scheduling` default direction); None counts as 0."""
    text: Any = None

    @model_validator(mode="after")
    def _check(self) -> "GenerateRequest":
        if self.text is not None:
            raise ValueError("@text: text prompts are not supported by the local engine; send input_ids")
        return self


class AbortRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: str = ""
    abort_all: StrictBool = False


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mode: Literal["abort", "retract", "in_place"] = "abort"


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model_path: str = Field(min_length=1)
    load_format: str | None = None
    abort_all_requests: StrictBool = False
    weight_version: str | None = None
    flush_cache: StrictBool = True


class BadRequest(ValueError):
    """A request the engine refuses; the message names the field."""


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part).startswith("function-"):
            continue  # union-branch labels pydantic adds (e.g. "list[int]"), not field names
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def describe(err: ValidationError, prefix: str = "") -> str:
    """One line per distinct problem, each starting with the field path."""
    seen: list[str] = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = tuple(e["loc"])
        if msg.startswith("@"):  # a model validator naming the field it is about
            name, msg = msg[1:].split(": ", 1)
            loc += (name,)
        line = f"{prefix}{_loc(loc)}: {msg}"
        if line not in seen:
            seen.append(line)
    return "; ".join(seen[:6])


def decode_json(raw: bytes, model: type[BaseModel], required: bool = True) -> dict:
    """The JSON object of a body; BadRequest naming the problem otherwise."""
    if not raw.strip():
        if not required:
            return {}
        fields = [n for n, f in model.model_fields.items() if f.is_required()]
        raise BadRequest(f"body: empty; expected a JSON object with {', '.join(fields)}")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise BadRequest(f"body: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise BadRequest(f"body: expected a JSON object, got {type(data).__name__}")
    return data


def validate(data: dict, model: type[BaseModel], prefix: str = ""):
    """`model.model_validate(data)`, BadRequest with field-naming messages on failure."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise BadRequest(describe(e, prefix)) from e


def parse_body(raw: bytes, model: type[BaseModel], required: bool = True) -> Any:
    """Decode and validate a JSON body; BadRequest with a field-naming message otherwise."""
    return validate(decode_json(raw, model, required), model)


#: GenerateReqInput fields that may hold one value per prompt in a batch.
_PER_PROMPT = ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num")


def split_batch(data: dict) -> list[dict] | None:
    """SGLang batch form (`input_ids` a list of lists) as one body per prompt; None if single."""
    ids = data.get("input_ids")
    if not (isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids)):
        return None
    if data.get("stream"):
        raise BadRequest("stream: streaming a batch (input_ids as a list of lists) is not supported")
    bodies = []
    for i, prompt in enumerate(ids):
        body = dict(data, input_ids=prompt)
        for key in _PER_PROMPT:
            value = data.get(key)
            if isinstance(value, list):
                if len(value) != len(ids):
                    raise BadRequest(f"{key}: has {len(value)} entries for {len(ids)} prompts")
                body[key] = value[i]
        bodies.append(body)
    return bodies

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
import re
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError,
                      model_validator)

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
    lora_path: str | None = None
    """SGLang's per-request adapter: the name a `/load_lora_adapter` gave it (this engine
    applies its one loaded adapter to every request and refuses any other name)."""

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


#: vLLM request fields the local engine does not implement, with their neutral value.
VLLM_NEUTRAL: dict[str, Any] = {
    "n": 1, "best_of": None, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    "min_p": 0.0, "min_tokens": 0, "prompt_logprobs": None, "logit_bias": None, "allowed_token_ids": None,
    "bad_words": None, "structured_outputs": None, "guided_json": None, "guided_regex": None,
    "guided_choice": None, "guided_grammar": None, "response_format": None, "truncate_prompt_tokens": None,
    "use_beam_search": False, "length_penalty": 1.0, "logprob_token_ids": None, "echo": False, "suffix": None,
    "kv_transfer_params": None, "features": None, "cache_salt": None, "stream_options": None,
    "detokenize": True, "add_special_tokens": True, "user": None, "vllm_xargs": None,
}


def _drop_nulls(data: Any) -> Any:
    """JSON null means "the default" in vLLM's requests (`normalize_null_max_tokens` and kin)."""
    return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


def _neutral_extras(model: BaseModel, known: set[str]) -> None:
    """Fields vLLM has and the local engine does not: accepted only at their neutral value."""
    for name, value in (model.model_extra or {}).items():
        if name in VLLM_NEUTRAL and name not in known:
            if value != VLLM_NEUTRAL[name]:
                raise ValueError(f"@{name}: {value!r} is not supported by the local engine "
                                 f"(only {VLLM_NEUTRAL[name]!r})")
        else:
            raise ValueError(f"@{name}: unknown parameter")


class VllmSampling(BaseModel):
    """vLLM's `SamplingParams` fields the local engine implements (names and defaults as vLLM's)."""

    model_config = ConfigDict(extra="allow")

    max_tokens: StrictInt | None = Field(None, ge=1)
    """None: up to the context length (the generate route's default)."""
    temperature: StrictFloat = Field(1.0, ge=0.0)
    top_p: StrictFloat = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(0, ge=-1)
    """0 or -1: off."""
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: StrictBool = False
    logprobs: StrictInt | None = Field(None, ge=0, le=20)
    """How many top logprobs per token besides the sampled one's (None: no logprobs)."""
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False

    _drop = model_validator(mode="before")(_drop_nulls)

    @model_validator(mode="after")
    def _neutral(self) -> "VllmSampling":
        _neutral_extras(self, set(type(self).model_fields))
        return self

    def engine_params(self, default_max: int) -> SamplingParams:
        """The same sampling in the engine's (SGLang's) names."""
        return SamplingParams(
            max_new_tokens=self.max_tokens if self.max_tokens is not None else default_max,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k if self.top_k >= 1 else -1,
            stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            no_stop_trim=self.include_stop_str_in_output, sampling_seed=self.seed)


class VllmGenerateRequest(BaseModel):
    """POST /inference/v1/generate: vLLM's tokens-in/tokens-out request."""

    model_config = ConfigDict(extra="allow")

    token_ids: list[TokenId] = Field(min_length=1)
    sampling_params: VllmSampling
    request_id: str | None = None
    model: str | None = None
    stream: StrictBool = False
    priority: StrictInt = 0
    """vLLM's direction: lower is admitted first."""

    _drop = model_validator(mode="before")(_drop_nulls)

    @model_validator(mode="after")
    def _neutral(self) -> "VllmGenerateRequest":
        _neutral_extras(self, set(type(self).model_fields))
        return self


class VllmCompletionRequest(VllmSampling):
    """POST /v1/completions with one token-id prompt (text prompts are refused)."""

    prompt: Any = None
    model: str | None = None
    stream: StrictBool = False
    max_tokens: StrictInt | None = Field(16, ge=1)
    """OpenAI's and vLLM's completions default: 16."""
    request_id: str | None = None
    priority: StrictInt = 0
    return_token_ids: StrictBool = False
    return_tokens_as_token_ids: StrictBool = False

    @model_validator(mode="after")
    def _token_prompt(self) -> "VllmCompletionRequest":
        p = self.prompt
        if p is None or p == [] or p == "":
            raise ValueError("@prompt: required: one prompt as a list of token ids")
        if isinstance(p, str) or (isinstance(p, list) and all(isinstance(x, str) for x in p)):
            raise ValueError("@prompt: text prompts are not supported by the local engine; send a list of token ids")
        if not isinstance(p, list):
            raise ValueError(f"@prompt: expected a list of token ids, got {type(p).__name__}")
        if all(isinstance(x, list) for x in p):
            raise ValueError("@prompt: one prompt per request (a list of token ids, not a list of lists)")
        for i, t in enumerate(p):
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"@prompt[{i}]: {t!r} is not a token id (an int >= 0)")
        return self


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
        if msg.startswith("@"):  # a model validator naming the field it is about ("prompt[3]" too)
            name, msg = msg[1:].split(": ", 1)
            loc += tuple(int(i) if i else n for n, i in re.findall(r"(\w+)|\[(\d+)\]", name))
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
_PER_PROMPT = ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num", "lora_path")


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

"""What makes recorded token ids mean the same thing to a trainer: the tokenizer (its whole
pipeline: vocabulary, merges, normalizer, special tokens) and the chat template. A live
session records both hashes; `trainers.live` refuses sessions whose hashes differ from the run's.
"""
from __future__ import annotations

import hashlib
import json


def template_hash(tokenizer) -> str:
    """The chat template's hash, as the proxy's renderer records it (`chat_template_hash`)."""
    return hashlib.sha256(tokenizer.chat_template.encode()).hexdigest()[:16]


def tokenizer_hash(tokenizer) -> str:
    """A fingerprint of the tokenizer: its fast backend serialized (vocabulary, merges,
    normalizer, pre-tokenizer, added tokens), else its vocabulary and special tokens."""
    fast = getattr(tokenizer, "backend_tokenizer", None)
    if fast is not None:
        text = fast.to_str()
    else:  # a slow tokenizer: what it maps, which is what token ids mean
        text = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens])
    return hashlib.sha256(text.encode()).hexdigest()[:16]

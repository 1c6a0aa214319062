"""Rule 6 of the mask policy: fields that change the logits in a way a trainer cannot replay
from the mask alone (penalties, logit bias, grammars, min tokens, custom logit processors,
tool calling, response formats, LoRA adapters). Each is refused with
`sampling_mask_logit_transform`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from maskgate.protocol.errors import PolicyError

# Fields that change logits in a way a trainer cannot replay from the mask alone (rule 6).
PENALTIES = (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0))
GRAMMAR_FIELDS = (
    "regex",
    "ebnf",
    "json_schema",
    "structural_tag",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
MIN_TOKENS_FIELDS = ("min_tokens", "min_new_tokens")
ADAPTER_FIELDS = ("lora_path", "lora_id", "lora_name")  # SGLang's adapter selection
# Every field check_logit_transforms reads: a body with none of them passes at once.
_TRANSFORM_FIELDS = frozenset(
    [name for name, _ in PENALTIES]
    + ["logit_bias", *GRAMMAR_FIELDS, *MIN_TOKENS_FIELDS, "custom_logit_processor"]
)


def check_logit_transforms(d: Mapping[str, Any], where: str) -> None:
    if d.keys().isdisjoint(_TRANSFORM_FIELDS):
        return
    for name, neutral in PENALTIES:
        value = d.get(name)
        if value is not None and value != neutral:
            raise transform(where + name, f"{name}={value}")
    bias = d.get("logit_bias")
    if bias not in (None, {}, []):
        raise transform(where + "logit_bias", "a non-empty logit_bias")
    for name in GRAMMAR_FIELDS:
        if d.get(name) not in (None, "", [], {}):
            raise transform(where + name, f"a grammar constraint ({name})")
    for name in MIN_TOKENS_FIELDS:
        if (d.get(name) or 0) > 0:
            raise transform(where + name, f"{name} (it suppresses end-of-sequence tokens)")
    if d.get("custom_logit_processor") not in (None, ""):
        raise transform(where + "custom_logit_processor", "a custom logit processor")


def check_tools(body: Mapping[str, Any]) -> None:
    """Tool calling constrains decoding in SGLang: always for tool_choice "required" or a
    named function, and for "auto" when a tool is strict or the server's tool strictness
    says so (which the gateway cannot see). Only tool_choice "none" leaves sampling free."""
    for tools_name, choice_name in (("tools", "tool_choice"), ("functions", "function_call")):
        if body.get(tools_name) in (None, [], {}):
            continue
        choice = body.get(choice_name, "auto")
        if choice in ("none", None):
            continue
        shown = choice if isinstance(choice, str) else "a named function"
        raise transform(
            choice_name,
            f"{tools_name} with {choice_name} {shown!r} (tool calls constrain decoding to "
            f'their grammar; send {choice_name} "none" or no {tools_name})',
        )


def check_response_format(body: Mapping[str, Any]) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if kind not in (None, "text"):
        raise transform("response_format", f"a grammar constraint (response_format {kind!r})")


def check_custom_processor(value: Any, flags: list[bool]) -> None:
    if isinstance(value, list):
        hit = any(v not in (None, "") and f for v, f in zip(value, flags, strict=False))
    else:
        hit = value not in (None, "")
    if hit:
        raise transform("custom_logit_processor", "a custom logit processor")


def check_adapter(body: Mapping[str, Any], flags: list[bool], openai: bool) -> None:
    """An adapter (LoRA) changes the logits the trainer replays: rule 6."""
    for name in ADAPTER_FIELDS:
        value = body.get(name)
        if value is None or value == "":
            continue  # the common case, decided without building a list per prompt
        values = value if isinstance(value, list) else [value] * len(flags)
        if any(v not in (None, "") and f for v, f in zip(values, flags, strict=False)):
            raise transform(name, f"a LoRA adapter ({name})")
    model = body.get("model")
    if openai and isinstance(model, str) and ":" in model:  # SGLang's "base:adapter"
        raise transform("model", f"a LoRA adapter (model {model!r} names one after ':')")


def transform(param: str, what: str) -> PolicyError:
    return PolicyError(
        "sampling_mask_logit_transform",
        f"return_sampling_mask cannot be combined with {what}: the trainer cannot replay "
        "that logit transform from the mask",
        param=param,
    )

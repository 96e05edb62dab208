"""Turn framing: the text around each message (role headers, end-of-turn tokens), read off the model's chat template.

    from flywheel.policy.chat_template import framing_for
    frame = framing_for(tokenizer)        # Framing: start/header/footer text per role, the generation prompt
    frame.header["user"], frame.footer["assistant"]   # e.g. "<|start_header_id|>user<|end_header_id|>\\n\\n", "<|eot_id|>"

Why probe rather than call the template per turn: a chat template renders a whole conversation at once, and many
(Qwen3's, Mistral's) re-render history, so tokenizing their output turn by turn is not append-only and lets text in
a message become a special token. Instead the template is rendered once, at start-up, on sentinel messages; the text
between the sentinels is each role's header and footer. `ChatFormat` (chat.py) then builds every prompt from those
frames plus message bodies encoded with markers off: the model sees its own template's turns, rendering stays
append-only by construction, and no message text can forge a boundary.

flywheel's own tokenizer (its template is `CHAT_TEMPLATE`) and a tokenizer with no template but ChatML tokens get
the built-in ChatML frames, token for token what flywheel always rendered. Everything a tokenizer can lack is a
`TokenizerError`, one line that says what to change.

Tests: `.venv/bin/python -m pytest -q tests/unit/test_tool_formats.py tests/unit/test_chat.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flywheel.config import ConfigError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")

# The Hugging Face chat template saved with flywheel's tokenizer; it must produce exactly `render_chat_text`'s string
# (tested with `tokenizer.apply_chat_template`). Accepts both our tool/call dicts and the OpenAI-style
# {"type": "function", "function": {...}} wrappers that transformers users pass.
CHAT_TEMPLATE = r"""
{%- set ns = namespace(tools='') -%}
{%- if tools -%}
  {%- for tool in tools -%}
    {%- set t = tool.function if tool.function is defined else tool -%}
    {%- set ns.tools = ns.tools ~ '\n' ~ (t | tojson) -%}
  {%- endfor -%}
  {%- set ns.tools = '# Tools' ~ ns.tools -%}
{%- endif -%}
{%- if ns.tools and (not messages or messages[0].role != 'system') -%}
  {{- '<|im_start|>system\n' ~ ns.tools ~ '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else '' -%}
  {{- '<|im_start|>' ~ message.role ~ '\n' -}}
  {%- if loop.first and message.role == 'system' and ns.tools -%}
    {{- (content ~ '\n\n' ~ ns.tools) if content else ns.tools -}}
  {%- else -%}
    {{- content -}}
  {%- endif -%}
  {%- if message.role == 'assistant' and message.tool_calls -%}
    {%- for call in message.tool_calls -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- set args = fn.arguments if fn.arguments is defined else {} -%}
      {%- set args = args if args is string else (args | tojson) -%}
      {%- set js = '{"name": ' ~ (fn.name | tojson) ~ ', "arguments": ' ~ args ~ '}' -%}
      {%- set js = js | replace('<|endoftext|>', '\\u003c|endoftext|>') -%}
      {%- set js = js | replace('<|im_start|>', '\\u003c|im_start|>') -%}
      {%- set js = js | replace('<|im_end|>', '\\u003c|im_end|>') | replace('<tool_call>', '\\u003ctool_call>') -%}
      {%- set js = js | replace('</tool_call>', '\\u003c/tool_call>') -%}
      {{- '<tool_call>' ~ js ~ '</tool_call>' -}}
    {%- endfor -%}
  {%- endif -%}
  {{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()


class TokenizerError(ConfigError):
    """The model's tokenizer cannot carry flywheel's chat format; the message says what to change. A ConfigError:
    the command line prints it as one line (the model directory is the user's choice)."""


@dataclass(frozen=True)
class Framing:
    """The text around message bodies. Frame strings are tokenized with the tokenizer's special tokens on.

    A conversation renders as start[first role] + body + footer[role], then header[role] + body + footer[role] for
    each later message, then `header["assistant"]` (the generation prompt). footer["assistant"] begins with the
    end-of-turn token the engine stops on; the rest of it opens the next observation.
    """

    start: dict[str, str]  # before the first message's body, by its role (BOS, a default system turn, the header)
    header: dict[str, str]  # before a later message's body, by role
    footer: dict[str, str]  # after a message's body, by role
    fold_system: bool  # the template has no system turn: the system text opens the first user message instead
    source: str  # "chatml" (built in) or "template" (read off the tokenizer's chat template)


def chatml_framing() -> Framing:
    """flywheel's ChatML turns: `<|im_start|>{role}\\n{body}<|im_end|>\\n`."""
    header = {r: f"{IM_START}{r}\n" for r in ROLES}
    return Framing(start=dict(header), header=header, footer={r: f"{IM_END}\n" for r in ROLES}, fold_system=False,
                   source="chatml")


# Sentinel bodies: no whitespace (templates `trim`), no markup (templates escape), unlikely in any template.
_S = {"system": "FWsys0q", "user": "FWusr1q", "assistant": "FWast2q", "user2": "FWusr3q", "tool": "FWtool4q"}


def _render(tok: Any, msgs: list[tuple[str, str]], gen: bool) -> str | None:
    try:
        text = tok.apply_chat_template([{"role": r, "content": _S[k]} for r, k in msgs], tokenize=False,
                                       add_generation_prompt=gen)
    except Exception:  # a template that refuses a probe (roles must alternate, no tool role): that shape is absent
        return None
    return text if isinstance(text, str) else None


def _split(text: str | None, keys: list[str]) -> list[str] | None:
    """The text before, between and after the sentinels `keys` (each exactly once, in order), or None."""
    if text is None:
        return None
    parts, pos = [], 0
    for k in keys:
        if text.count(_S[k]) != 1:
            return None
        i = text.find(_S[k], pos)
        if i == -1:
            return None
        parts.append(text[pos:i])
        pos = i + len(_S[k])
    return parts + [text[pos:]]


def _refuse(what: str) -> TokenizerError:
    return TokenizerError(f"the tokenizer's chat template {what}; flywheel renders turns from the template's own "
                          "headers and end-of-turn tokens. Give the model a template that renders each message as "
                          "header + content + end-of-turn (its family's chat_template.jinja), or set "
                          "tokenizer.path to a tokenizer that has one")


def probe_framing(tok: Any) -> Framing:
    """Read the frames off `tok.chat_template` by rendering sentinel messages (see the module docstring)."""
    ua = _split(_render(tok, [("user", "user"), ("assistant", "assistant")], False), ["user", "assistant"])
    uau = _split(_render(tok, [("user", "user"), ("assistant", "assistant"), ("user", "user2")], False),
                 ["user", "assistant", "user2"])
    if ua is None or uau is None:
        raise _refuse("cannot render a user turn, an assistant turn and a user turn with each message's content "
                      "once and in order")
    footer = {"assistant": ua[2], "user": uau[3]}
    start = {"user": ua[0]}
    if not uau[2].startswith(footer["assistant"]) or not uau[1].startswith(footer["user"]):
        raise _refuse("writes different text after a message depending on what follows it (not append-only)")
    header = {"user": uau[2][len(footer["assistant"]):]}
    plain, prompted = _render(tok, [("user", "user")], False), _render(tok, [("user", "user")], True)
    if plain is None or prompted is None or not prompted.startswith(plain):
        raise _refuse("does not end a prompt with a generation prompt appended to the conversation "
                      "(add_generation_prompt)")
    # The generation prompt is the assistant header: what the model samples after it is the turn's content.
    header["assistant"] = prompted[len(plain):]
    if not footer["assistant"]:
        raise _refuse("writes nothing after an assistant turn: it has no end-of-turn token to stop on")
    # System turns: a template without them (Mistral's) gets the system text at the head of the first user message.
    sua = _split(_render(tok, [("system", "system"), ("user", "user"), ("assistant", "assistant")], False),
                 ["system", "user", "assistant"])
    fold = sua is None or not sua[1].endswith(header["user"])
    if sua is not None and not fold:
        start["system"] = sua[0]
        footer["system"] = sua[1][: len(sua[1]) - len(header["user"])]
    # Tool turns: where the template frames a "tool" message after an assistant turn (ChatML, Qwen2.5, Llama 3.1).
    # Without, the format writes results its own way (a user turn, or Mistral's bare [TOOL_RESULTS] block).
    uat_msgs = [("user", "user"), ("assistant", "assistant"), ("tool", "tool")]
    uat_plain = _render(tok, uat_msgs, False)
    uat = _split(uat_plain, ["user", "assistant", "tool"])
    if uat is not None and uat[2].startswith(footer["assistant"]) \
            and _render(tok, uat_msgs, True) == f"{uat_plain}{header['assistant']}":
        header["tool"] = uat[2][len(footer["assistant"]):]
        footer["tool"] = uat[3]
    return Framing(start=start, header=header, footer=footer, fold_system=fold, source="template")


def framing_for(tok: Any, has_token: Any) -> Framing:
    """The frames for `tok`: ChatML for flywheel's own tokenizer (or none but ChatML tokens), else its template's."""
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default")
    if template is None or template == CHAT_TEMPLATE:
        for marker in (IM_START, IM_END):
            if not has_token(marker):
                raise TokenizerError(
                    f"the tokenizer has no {marker!r} token: flywheel renders ChatML turns, whose markers must be "
                    "single tokens, for a tokenizer without a chat template (this one has none). Save the model's "
                    "chat template with its tokenizer (chat_template.jinja, as `flywheel models import` does), or "
                    "pick a model with a ChatML chat template (Qwen2, Qwen3, SmolLM2); a model trained from scratch "
                    "gets one from flywheel (leave tokenizer.path unset)")
        return chatml_framing()
    if not isinstance(template, str):
        raise TokenizerError(f"the tokenizer's chat_template is a {type(template).__name__}, not a Jinja string; "
                             "save the model's chat template as chat_template.jinja next to tokenizer.json")
    return probe_framing(tok)

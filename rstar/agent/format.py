"""The rStar2-Agent interaction format: prompts, the tool schema, tool calls and responses.

One chat template (Jinja, ChatML-style with a Hermes tools block) is stored with the
tokenizer, so transformers, vLLM and verl render a conversation identically. The agent
loop appends tool responses by rendering `tool_turn()`, which is exactly what the template
renders for tool messages, and the tests check the two agree token for token.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass

TOOL_NAME = "execute_python_code_with_standard_io"
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Execute Python code. Standard input is given by `input`; the response is "
        "the standard output, the value of a final bare expression, or the error.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python code to run."},
                "input": {
                    "type": "string",
                    "description": "Text given to the code on standard input.",
                },
            },
            "required": ["code", "input"],
        },
    },
}

SYSTEM_PROMPT = (
    "You are a helpful assistant that solves problems by reasoning and, when useful, by running "
    "Python. Think inside <reason> </reason> tags. To run code, call the tool inside <tool_call> "
    "</tool_call> tags; its result comes back inside <tool_response> </tool_response> tags. Give "
    "the final answer inside <answer> </answer> tags, with the final result in \\boxed{}."
)
USER_PREFIX = (
    "Solve the following problem. Put your final answer within <answer> </answer> tags, with the "
    "result in \\boxed{}.\n\n"
)

IM_START, IM_END, EOS = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


@dataclass(frozen=True)
class PromptStyle:
    """What precedes the problem: the system prompt, whether it lists the tool schema (Hermes
    tools block), and the user-turn prefix."""

    system: str
    user_prefix: str
    list_tools: bool

    def messages(self, problem: str) -> list[dict]:
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.user_prefix + problem},
        ]

    @property
    def tools(self) -> list[dict] | None:
        return [TOOL_SCHEMA] if self.list_tools else None


# "paper" is the rStar2-Agent prompt. "compact" keeps the same tags, tool-call JSON and tool
# responses but drops the ~300-token preamble: a few-million-parameter model trained on CPU
# pays for every prompt token in every rollout and update.
STYLES = {
    "paper": PromptStyle(SYSTEM_PROMPT, USER_PREFIX, True),
    "compact": PromptStyle(
        "Think in <reason>, run Python in <tool_call>, answer in <answer> with \\boxed{}.",
        "",
        False,
    ),
}

# The template: system (with the tools block), then turns. Assistant tool calls render as
# <tool_call>{json}</tool_call>; consecutive tool messages share one user turn. All text is
# emitted through expressions so whitespace control can never eat a newline.
CHAT_TEMPLATE = (
    "{%- set tools = tools if tools is defined and tools else none -%}{%- if messages and "
    "messages[0].role == 'system' -%}{%- set system = messages[0].content -%}{%- set rest = "
    "messages[1:] -%}{%- else -%}{%- set system = none -%}{%- set rest = messages -%}{%- endif "
    "-%}{%- if system is not none or tools -%}{{- '<|im_start|>system\\n' + (system if system is "
    "not none else '') -}}{%- if tools -%}{{- '\\n\\n# Tools\\n\\nYou may call one or more "
    "functions to assist with the user query.\\n\\nYou are provided with function signatures "
    "within <tools></tools> XML tags:\\n<tools>' -}}{%- for tool in tools -%}{{- '\\n' + (tool | "
    "tojson) -}}{%- endfor -%}{{- '\\n</tools>\\n\\nFor each function call, return a json object "
    "with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, '
    '"arguments": '
    "<args-json-object>}\\n</tool_call>' -}}{%- endif -%}{{- '<|im_end|>\\n' -}}{%- endif -%}{%- "
    "for m in rest -%}{%- if m.role == 'tool' -%}{%- if loop.first or rest[loop.index0 - 1].role "
    "!= 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}{{- '\\n<tool_response>\\n' + m.content + "
    "'\\n</tool_response>' -}}{%- if loop.last or rest[loop.index0 + 1].role != 'tool' -%}{{- "
    "'<|im_end|>\\n' -}}{%- endif -%}{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + (m.content "
    "if m.content else '') -}}{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}{%- if m.content "
    "or not loop.first -%}{{- '\\n' -}}{%- endif -%}{{- '<tool_call>\\n' + ({'name': c.name, "
    "'arguments': c.arguments} | tojson) + '\\n</tool_call>' -}}{%- endfor -%}{%- endif -%}{{- "
    "'<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{- "
    "'<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@functools.cache
def _compiled_template():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    return env.from_string(CHAT_TEMPLATE)


def render(
    messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = False
) -> str:
    """Render like transformers' apply_chat_template does (same Jinja settings and `tojson`),
    without needing a tokenizer: used to build the tokenizer's own training corpus."""
    return _compiled_template().render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
    )


def problem_messages(problem: str, style: str = "paper") -> list[dict]:
    return STYLES[style].messages(problem)


def prompt_ids(tokenizer, problem: str, style: str = "paper") -> list[int]:
    """The tokens a rollout of `problem` starts from: system, tools and the problem in the
    model's chat template, up to the assistant header."""
    s = STYLES[style]
    text = tokenizer.apply_chat_template(
        s.messages(problem), tools=s.tools, tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


STYLE_FILE = "rstar.json"  # beside a trained checkpoint: the prompt style it was trained with


def save_style(model_dir: str, style: str) -> None:
    with open(os.path.join(model_dir, STYLE_FILE), "w") as f:
        json.dump({"prompt_style": style}, f)


def saved_style(model_dir: str) -> str | None:
    """The prompt style a checkpoint was trained with (None: not one this project trained)."""
    path = os.path.join(model_dir, STYLE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["prompt_style"]


def tool_turn(responses: list[str]) -> str:
    """The text appended after an assistant turn that called tools (its <|im_end|> included by
    the model): the tool responses as one user turn, then the next assistant header."""
    body = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in responses)
    return f"\n{IM_START}user{body}{IM_END}\n{IM_START}assistant\n"


@dataclass
class ToolCall:
    name: str | None
    arguments: dict | None
    error: str | None  # why the call is unusable (the model reads this as the tool response)
    raw: str


_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every <tool_call>...</tool_call> in an assistant turn. A malformed one becomes a ToolCall
    with `error` set (never an exception): bad JSON, an unknown tool, wrong argument types."""
    calls = []
    for m in _CALL.finditer(text):
        raw = m.group(1).strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            calls.append(
                ToolCall(
                    None,
                    None,
                    f"Failed to decode tool call: {e.msg} (line {e.lineno}, "
                    f'column {e.colno}). Send a JSON object with "name" and "arguments".',
                    raw,
                )
            )
            continue
        if not isinstance(obj, dict):
            calls.append(
                ToolCall(
                    None, None, 'Tool call must be a JSON object with "name" and "arguments".', raw
                )
            )
            continue
        name, args = obj.get("name"), obj.get("arguments", {})
        if name != TOOL_NAME:
            calls.append(
                ToolCall(name, None, f"Unknown tool {name!r}. The only tool is {TOOL_NAME!r}.", raw)
            )
            continue
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if (
            not isinstance(args, dict)
            or not isinstance(args.get("code"), str)
            or not isinstance(args.get("input", ""), str)
        ):
            calls.append(
                ToolCall(
                    name,
                    None,
                    'Invalid arguments: "code" must be a string and "input" (optional) a string.',
                    raw,
                )
            )
            continue
        calls.append(
            ToolCall(name, {"code": args["code"], "input": args.get("input", "")}, None, raw)
        )
    unclosed = text.count("<tool_call>") - len(_CALL.findall(text))
    if unclosed > 0:
        calls.append(
            ToolCall(
                None,
                None,
                "Failed to decode tool call: <tool_call> without </tool_call>.",
                text[text.rfind("<tool_call>") :],
            )
        )
    return calls

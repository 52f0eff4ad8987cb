"""Tools a model may call during a rollout (`tools:` in the config), and the protocol it calls them by.

A tool is a Python callable named by `_target_`, with a description and JSON-schema parameters:

    tools:
      calculator:
        _target_: rlvr.tools.calculator.calculator
        description: Evaluate an arithmetic expression.
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}

The model calls one by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the
convention of Qwen2.5's and Hermes' chat templates); generation stops there, the call runs, and its
result comes back as a `tool` message (rlvr.rollout.multiturn). Templates that take `tools=` present
the tools themselves; for the others (SmolLM2's, the tiny model's) `instructions` writes them into
the system message.

A call that does not parse, names no tool, has arguments its schema rejects, raises, runs past
`rollout.tool_timeout_s`, or returns more than `rollout.tool_output_chars` characters (cut) is
answered with an error message to the model and counted; the run goes on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlvr.errors import RlvrError, import_failure
from rlvr.timeout import call_with_timeout

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.DOTALL)


class ToolConfigError(RlvrError, ValueError):
    """A tool that cannot be loaded; the message names its key."""


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the keyword arguments
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema that chat templates' `tools=` take."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def load_tools(specs: DictConfig | dict) -> dict[str, Tool]:
    """The tools of the `tools` config, each checked at start: `_target_` imports and is callable,
    `description` is text, `parameters` is a valid JSON schema of an object."""
    import jsonschema
    from hydra.utils import get_method

    tools = {}
    for name, spec in specs.items():
        key = f"tools.{name}"
        if not isinstance(spec, dict | DictConfig) or not isinstance(spec.get("_target_"), str):
            raise ToolConfigError(f"{key}._target_ is missing: each tool names its Python callable by dotted path")
        unknown = set(spec) - {"_target_", "description", "parameters", "kwargs"}
        if unknown:
            raise ToolConfigError(f"{key}: no such key {sorted(unknown)[0]!r}; a tool takes _target_, description, "
                                  "parameters, kwargs")
        try:
            fn = get_method(spec["_target_"])
        except Exception as e:
            raise ToolConfigError(f"{key}._target_={spec['_target_']!r} cannot be imported: "
                                  f"{import_failure(spec['_target_'], e)}") from e
        if not isinstance(spec.get("description"), str) or not spec["description"].strip():
            raise ToolConfigError(f"{key}.description must say what the tool does (the model reads it)")
        parameters = OmegaConf.to_container(spec.parameters) if isinstance(spec.get("parameters"), DictConfig) \
            else spec.get("parameters")
        try:
            jsonschema.Draft202012Validator.check_schema(parameters)
            if not isinstance(parameters, dict) or parameters.get("type") != "object":
                raise jsonschema.SchemaError("the arguments are an object: the schema needs type: object")
        except jsonschema.SchemaError as e:
            raise ToolConfigError(f"{key}.parameters is not a valid JSON schema of the arguments: {e.message}") from e
        kwargs = spec.get("kwargs") or {}
        kwargs = OmegaConf.to_container(kwargs) if isinstance(kwargs, DictConfig) else dict(kwargs)
        tools[name] = Tool(name, spec["description"], parameters,
                           (lambda f, kw: lambda **args: f(**args, **kw))(fn, kwargs))
    return tools


def parse_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The last `<tool_call>` in `text` as (name, arguments); None when there is none. Raises
    ValueError saying what is wrong with a call that does not parse.

    >>> parse_call('<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>')
    ('calculator', {'expression': '2*3'})
    >>> parse_call("no call") is None
    True
    """
    if CALL_CLOSE not in text:
        return None
    calls = _CALL.findall(text)
    if not calls:
        raise ValueError(f"{CALL_CLOSE} without a {CALL_OPEN} before it")
    return read_call(calls[-1])


def all_calls(text: str) -> list[str]:
    """The bodies of every `<tool_call>…</tool_call>` of `text`, in order."""
    return _CALL.findall(text)


def read_call(body: str) -> tuple[str, dict[str, Any]]:
    """The (name, arguments) of one call's body; raises ValueError saying what is wrong with it."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"the call is not JSON ({e})") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError('the call must be a JSON object {"name": ..., "arguments": {...}}')
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise ValueError("the arguments are not a JSON object") from None
    if not isinstance(args, dict):
        raise ValueError("the arguments must be a JSON object")
    return call["name"], args


class ToolBox:
    """The configured tools, called with a time limit and an output cap."""

    def __init__(self, tools: dict[str, Tool], timeout_s: float | None, max_output_chars: int):
        self.tools, self.timeout_s, self.max_output_chars = tools, timeout_s, max_output_chars

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools.values()]

    def instructions(self) -> str:
        """The tools and the call protocol, as text for the system message of a template without `tools=`."""
        return instructions(self.schemas())


    def call(self, name: str, args: dict[str, Any]) -> tuple[str, str | None]:
        """(the text the model gets back, None) or (an error message for the model, what went wrong)."""
        import jsonschema

        tool = self.tools.get(name)
        if tool is None:
            error = f"no tool named {name!r} (tools: {', '.join(self.tools)})"
            return f"error: {error}", error
        try:
            jsonschema.validate(args, tool.parameters)
        except jsonschema.ValidationError as e:
            error = f"arguments rejected by {name}'s schema: {e.message}"
            return f"error: {error}", error
        value, error = call_with_timeout(lambda: tool.fn(**args), self.timeout_s)
        if error is not None:
            return f"error: {name} failed: {error}", error
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > self.max_output_chars:
            extra = len(text) - self.max_output_chars
            return text[: self.max_output_chars] + f"... [{extra} more characters cut]", \
                f"output of {len(text)} characters cut to {self.max_output_chars}"
        return text, None


_PROBE_TOOL = {"type": "function", "function": {"name": "probe", "description": "A probe.",
                                                "parameters": {"type": "object", "properties": {}}}}


def takes_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template presents tools itself (renders `tools=`) and asks for calls in
    rlvr's protocol (`CALL_OPEN` … `CALL_CLOSE`, as Qwen's templates do). A template that asks for
    another format (Llama 3's bare JSON, Gemma's Python calls) is not given the tools: rlvr presents them
    with its own protocol (`instructions`), which is the one its rollouts read."""
    probe = [{"role": "user", "content": "?"}]
    with_tools = tokenizer.apply_chat_template(probe, tools=[_PROBE_TOOL], tokenize=False)
    return with_tools != tokenizer.apply_chat_template(probe, tokenize=False) and CALL_OPEN in with_tools


def instructions(schemas: list[dict[str, Any]]) -> str:
    """Tools (OpenAI-style schemas) and the call protocol, as text for the system message of a template
    without `tools=`."""
    lines = [f"You can call tools. To call one, write {CALL_OPEN}"
             '{"name": <tool name>, "arguments": <JSON object>}' f"{CALL_CLOSE} and stop; the result comes "
             "back in the next message. The tools:"]
    lines += [json.dumps({k: s["function"][k] for k in ("name", "description", "parameters")}) for s in schemas]
    return "\n".join(lines)

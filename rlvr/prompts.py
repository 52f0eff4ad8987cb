"""Prompts as the engine sees them: rendered through the model's chat template, and checked against
the engine's context before any of them reaches it.

vLLM refuses a request whose prompt plus `rollout.max_tokens` exceeds `rollout.max_model_len`. Every
task's prompts, training and held-out, go through `PromptFit`: one that does not fit is dropped and
counted (training draws more in its place); when none fits, the run stops at start with a message
that names the keys to change.
"""

from __future__ import annotations

import logging

from rlvr.errors import RlvrError
from rlvr.records import Prompt
from rlvr.tools import ToolBox, instructions, takes_tools

log = logging.getLogger("rlvr")

# Rounds of `task.sample(n)` a step may draw to find n training prompts that fit.
MAX_DRAWS = 10


class ContextError(RlvrError, ValueError):
    """A task's prompts do not fit the engine's context; the message names the keys to change."""


def render(tokenizer, prompt: Prompt, tools: ToolBox | None = None) -> list[int]:
    """Token ids of a prompt through the model's chat template, ready for the assistant's turn;
    with `tools` (the run's) and the prompt's own functions (`Prompt.tools`), presented as
    `render_with_tools` does."""
    return render_with_tools(tokenizer, prompt.messages, tools, offered=prompt.tools)


def render_with_tools(tokenizer, messages: list[dict[str, str]], tools: ToolBox | None,
                      tokenize: bool = True, offered: list[dict] | None = None) -> list[int] | str:
    """`messages` through the chat template with the assistant's turn opened, the tools (the run's
    `tools`, then the prompt's own `offered` schemas) presented by the template's own `tools=` where it
    has one, else as text at the end of the system message (`rlvr.tools.instructions`)."""
    kwargs = {}
    schemas = [*(tools.schemas() if tools is not None else []), *(offered or [])]
    if schemas:
        if takes_tools(tokenizer):
            kwargs["tools"] = schemas
        elif messages and messages[0]["role"] == "system":
            messages = [{"role": "system", "content": messages[0]["content"] + "\n\n" + instructions(schemas)},
                        *messages[1:]]
        else:
            messages = [{"role": "system", "content": instructions(schemas)}, *messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return tokenizer(text, add_special_tokens=False).input_ids if tokenize else text


class PromptFit:
    """Renders prompts and keeps those of at most `max_model_len - max_tokens` tokens."""

    def __init__(self, tokenizer, max_model_len: int, max_tokens: int, tools: ToolBox | None = None):
        self.tokenizer, self.max_model_len, self.max_tokens = tokenizer, max_model_len, max_tokens
        self.tools = tools  # presented in every prompt
        self.limit = max_model_len - max_tokens
        self.warned = False

    def fit(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[list[int]], list[int]]:
        """(the prompts that fit, their token ids, the lengths of those that do not)."""
        kept, ids, long = [], [], []
        for p in prompts:
            tokens = render(self.tokenizer, p, self.tools)
            if len(tokens) <= self.limit:
                kept.append(p)
                ids.append(tokens)
            else:
                long.append(len(tokens))
        return kept, ids, long

    def _none_fit(self, what: str, long: list[int]) -> ContextError:
        return ContextError(
            f"none of the {len(long)} {what} prompts fits the engine's context: the shortest is {min(long)} tokens "
            f"under the chat template, and rollout.max_model_len={self.max_model_len} leaves {self.limit} beside "
            f"rollout.max_tokens={self.max_tokens}. Raise rollout.max_model_len (to at least "
            f"{min(long) + self.max_tokens}), lower rollout.max_tokens, or make the task's prompts shorter (data.*).")

    def _warn(self, what: str, long: list[int], total: int) -> None:
        log.warning("%d of %d %s prompts are longer than the %d tokens rollout.max_model_len=%d leaves beside "
                    "rollout.max_tokens=%d (up to %d tokens): dropped%s", len(long), total, what, self.limit,
                    self.max_model_len, self.max_tokens, max(long),
                    " and drawn again (counted in data/dropped_prompts)" if what == "training" else "")

    def eval_prompts(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[list[int]]]:
        """The held-out prompts that fit, with a warning that counts the others; raise when none fits."""
        kept, ids, long = self.fit(prompts)
        if not kept:
            raise self._none_fit("held-out", long)
        if long:
            self._warn("held-out", long, len(prompts))
        return kept, ids

    def probe(self, task, n: int) -> None:
        """Check a sample of training prompts before the engine starts (as many as `sample` may draw for a
        step of `n`: a task whose prompts are often too long is not refused for a first draw of long ones);
        the task's state is put back, so the run draws exactly what it would have drawn."""
        state = task.state_dict()
        prompts = task.sample(n * MAX_DRAWS)
        task.load_state_dict(state)
        kept, _, long = self.fit(prompts)
        if not kept:
            raise self._none_fit("sampled training", long)

    def sample(self, task, n: int) -> tuple[list[Prompt], list[list[int]], int]:
        """`n` training prompts that fit, their token ids, and how many were dropped as too long."""
        prompts: list[Prompt] = []
        ids: list[list[int]] = []
        long: list[int] = []
        for _ in range(MAX_DRAWS):
            drawn = task.sample(n - len(prompts))
            more, more_ids, too_long = self.fit(drawn)
            if too_long and (note := getattr(task, "dropped", None)):  # (difficulty sampling's: not again)
                kept = {id(p) for p in more}
                note([p for p in drawn if id(p) not in kept])
            prompts += more
            ids += more_ids
            long += too_long
            if len(prompts) == n:
                break
        else:
            raise ContextError(f"only {len(prompts)} of {len(prompts) + len(long)} training prompts drawn in "
                               f"{MAX_DRAWS} rounds fit rollout.max_model_len={self.max_model_len} beside "
                               f"rollout.max_tokens={self.max_tokens}; raise rollout.max_model_len or lower "
                               "rollout.max_tokens.")
        if long and not self.warned:
            self._warn("training", long, len(prompts) + len(long))
            self.warned = True
        return prompts, ids, len(long)

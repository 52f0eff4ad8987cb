"""Multi-turn rollouts with tools: generate until the model calls a tool or ends, run the call,
append its result as a tool message, and go on, up to `rollout.max_turns` turns and
`rollout.max_total_tokens` completion tokens.

Every conversation of a call advances together: each turn is one batched engine call over the
conversations still waiting for one. The learner trains on exactly the token ids the engine saw:
each turn's sampled ids are kept as they are (never re-tokenised from text), and what rlvr appends
after a call (the end of the assistant turn, the tool message, the start of the next assistant
turn, as the chat template writes them) is tokenised on its own and marked 0 in
`Rollout.completion_mask`: it is in the context, out of the loss, and has no sampler logprob.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from rlvr.config import RolloutConfig
from rlvr.prompts import render_with_tools
from rlvr.records import Prompt, Rollout
from rlvr.rollout.engine import Engine
from rlvr.tools import CALL_CLOSE, ToolBox, load_tools, parse_call

_SENTINEL = "\u2063rlvr-assistant-turn\u2063"  # marks where the model's turn sits in a rendered template


def between_turns(tokenizer, tools: ToolBox | None, messages: list[dict[str, str]]) -> list[int]:
    """Token ids that close an assistant turn, give `messages` (a tool's result, say), and open the
    assistant's next turn, as the chat template writes them: what rlvr appends between the model's
    turns (the rollouts here, and the cold start's demonstrations, rlvr.sft)."""
    # (Mistral's template wants each tool message's call id, of at least 9 characters; others ignore it.)
    messages = [{"tool_call_id": "000000000", **m} if m["role"] == "tool" else m for m in messages]
    text = render_with_tools(tokenizer, [{"role": "user", "content": "?"}, {"role": "assistant", "content": _SENTINEL},
                                         *messages], tools, tokenize=False)
    return tokenizer(text[text.index(_SENTINEL) + len(_SENTINEL):], add_special_tokens=False).input_ids


class ToolRollouts:
    """`generate` with the signature of `Engine.generate`, running tool calls between turns."""

    def __init__(self, engine: Engine, tokenizer, toolbox: ToolBox, max_tokens: int, max_turns: int,
                 max_total_tokens: int | None, max_model_len: int):
        self.engine, self.tokenizer, self.toolbox = engine, tokenizer, toolbox
        self.max_tokens, self.max_turns, self.max_model_len = max_tokens, max_turns, max_model_len
        self.max_total_tokens = max_total_tokens

    def tool_turn_ids(self, result: str) -> list[int]:
        """Token ids that close the model's turn after a call, give the tool's result, and open the
        model's next turn, as the chat template writes them."""
        return between_turns(self.tokenizer, self.toolbox, [{"role": "tool", "content": result}])

    def _budget(self, r: Rollout) -> int:
        """New tokens the next turn of `r` may take (within `max_tokens`, the rollout's total and the context)."""
        used = len(r.completion_ids)
        total = self.max_total_tokens if self.max_total_tokens is not None else self.max_model_len
        return min(self.max_tokens, total - used, self.max_model_len - len(r.prompt_ids) - used)

    def generate(self, prompts: list[Prompt], prompt_ids: list[list[int]], n: int, seed: int,
                 greedy: bool = False, context: str = "") -> list[Rollout]:
        """`Engine.generate` with tool calls answered between turns (the first turn seeded as there;
        each later turn of a conversation by its first turn's seed and the turn's number)."""
        rollouts = self.engine.generate(prompts, prompt_ids, n, seed, greedy, context, stop=[CALL_CLOSE],
                                        max_tokens=[min(self.max_tokens, self.max_model_len - len(ids))
                                                    for ids in prompt_ids])
        # Sample k of the call was seeded seed + k (see Engine.generate); it stays its identity.
        sample_seed = {id(r): seed + k for k, r in enumerate(rollouts)}
        for r in rollouts:
            r.completion_mask = [1] * len(r.completion_ids)
            r.conversation = [{"role": "assistant", "content": r.text}]
        waiting = rollouts
        for turn in range(2, self.max_turns + 2):
            waiting = [r for r in waiting if self._answer_call(r, last_turn=turn > self.max_turns)]
            if not waiting:
                break
            # Each conversation continues as a prompt of its own, seeded by (its first turn's seed, turn)
            # alone: what else waits, and how a call over ranks split the prompts, changes nothing.
            seeds = [random.Random(f"{sample_seed[id(r)]}-turn-{turn}").randrange(2**31 - 2**20) for r in waiting]
            more = self.engine.generate([r.prompt for r in waiting], [r.prompt_ids + r.completion_ids for r in waiting],
                                        1, seeds, greedy, f"{context}, tool turn {turn}", stop=[CALL_CLOSE],
                                        max_tokens=[self._budget(r) for r in waiting])
            for r, m in zip(waiting, more, strict=True):
                r.completion_ids += m.completion_ids
                r.sampler_logprobs += m.sampler_logprobs
                r.completion_mask += [1] * len(m.completion_ids)
                r.finish_reason = m.finish_reason
                r.conversation.append({"role": "assistant", "content": m.text})
        for r in rollouts:
            r.text = self.tokenizer.decode(r.completion_ids, skip_special_tokens=True)
        return rollouts

    def _answer_call(self, r: Rollout, last_turn: bool) -> bool:
        """If the model's last turn ended in a tool call, run it and append the result to `r`; True
        when `r` then waits for another turn. A call that cannot be answered (no turn or token budget
        left) ends the rollout with finish reason "length"."""
        turn_text = r.conversation[-1]["content"]
        if r.finish_reason != "stop" or CALL_CLOSE not in turn_text:
            return False  # the model ended its answer (eos) or ran out of tokens
        if last_turn:
            r.finish_reason = "length"  # rollout.max_turns reached with a call pending
            return False
        r.tool_calls += 1
        try:
            call = parse_call(turn_text)
        except ValueError as e:
            result, error = f"error: {e}", str(e)
        else:
            result, error = self.toolbox.call(*call)
        r.tool_errors += error is not None
        ids = self.tool_turn_ids(result)
        if self._budget(r) - len(ids) < 1:  # no room for the result and a token of the next turn
            r.finish_reason = "length"
            return False
        r.conversation.append({"role": "tool", "content": result})
        r.completion_ids += ids
        r.sampler_logprobs += [0.0] * len(ids)
        r.completion_mask += [0] * len(ids)
        return True


# `Engine.generate`'s signature: what produces a step's rollouts (the engine's own, or with tools ToolRollouts')
Generate = Callable[..., list[Rollout]]


def rollout_generator(engine, tokenizer, tools: ToolBox | None, cfg: RolloutConfig) -> Generate:
    """The engine's `generate`, or with tools configured the multi-turn loop around it (`cfg`: the rollout config)."""
    if tools is None:
        return engine.generate
    return ToolRollouts(engine, tokenizer, tools, cfg.max_tokens, cfg.max_turns, cfg.max_total_tokens,
                        cfg.max_model_len).generate


def build_tools(tools: dict, rollout: RolloutConfig) -> ToolBox | None:
    """The `tools` of the config (checked: each one imports and has a valid schema), with the limits
    of `rollout` on each call, or None when there are none."""
    if not tools:
        return None
    return ToolBox(load_tools(tools), rollout.tool_timeout_s, rollout.tool_output_chars)

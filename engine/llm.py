"""Offline API: LLM(model).generate(prompts, params) and .chat(messages, params).

A front of its own: it refuses its callers' bad input (ValueError) before the engine sees it,
as the API does for its requests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestResult
from engine.request import Prompt, RequestTooLarge
from engine.sampling_params import SamplingParams

PromptInput = str | list[int]
Messages = list[dict[str, Any]]


class LLM:
    def __init__(self, model: str | None = None, **config: Any) -> None:
        self.engine = LLMEngine(EngineConfig.from_kwargs(model=model, **config))
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        cache_salt: str = "",
        retain_prefix: bool = False,
    ) -> list[RequestResult]:
        """Runs every prompt to completion (batched); results in the order of the prompts.
        `retain_prefix`: keep each prompt's blocks in the persistent tier (disk or Redis) for a
        while (prompt_cache_retention 24h); ValueError without one."""
        if retain_prefix and not self.engine.kv.can_retain:
            raise ValueError("retain_prefix needs a persistent KV cache tier (disk or Redis)")
        batch = _as_prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            param_list = [params or SamplingParams()] * len(batch)
        else:
            param_list = list(params)
            if len(param_list) != len(batch):
                raise ValueError("give one SamplingParams or one per prompt")
        tokenized = [self._tokenize(prompt) for prompt in batch]
        for prompt, p in zip(tokenized, param_list, strict=True):
            self._check(prompt, p)
        results: dict[str, RequestResult] = {}
        try:
            for prompt, p in zip(tokenized, param_list, strict=True):
                request_id = f"offline-{next(self._ids)}"
                self.engine.add_request(
                    request_id, prompt, p, cache_salt, retain_prefix=retain_prefix
                )
                results[request_id] = RequestResult(request_id)
        except Exception:  # one bad prompt: run none of the batch
            for request_id in results:
                self.engine.abort(request_id)
            raise
        unfinished = len(results)
        while unfinished:
            for out in self.engine.step():
                results[out.request_id].add(out)
                unfinished -= out.finished
        return list(results.values())

    def _check(self, prompt: Prompt, params: SamplingParams) -> None:
        """ValueError (RequestTooLarge past the context window) for input the engine refuses."""
        num_tokens, engine = len(prompt.token_ids), self.engine
        if num_tokens == 0:
            raise ValueError("the prompt is empty")
        if num_tokens >= engine.max_model_len:
            raise RequestTooLarge(
                f"prompt has {num_tokens} tokens; the context window is "
                f"{engine.max_model_len} (at least one token must be generated)"
            )
        if any(t >= engine.vocab_size for t, _ in params.logit_bias):
            raise ValueError(f"logit_bias token ids must be < {engine.vocab_size} (the vocabulary)")

    def _tokenize(self, prompt: PromptInput) -> Prompt:
        if isinstance(prompt, str):
            return Prompt(list(self.tokenizer.encode(prompt)), prompt)
        return Prompt(list(prompt))

    def chat(
        self,
        messages: Messages | Sequence[Messages],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        cache_salt: str = "",
    ) -> list[RequestResult]:
        """Each conversation rendered with the model's chat template (with `tools`, OpenAI tool
        objects, where given: the same renderer and text as the server's and the router's)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [
            self.tokenizer.apply_chat_template(list(m), add_generation_prompt=True, tools=tools)
            for m in conversations
        ]
        return self.generate(prompts, params, cache_salt=cache_salt)


def _as_prompt_list(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and isinstance(prompts[0], int):
        return [prompts]  # one tokenized prompt
    return [p if isinstance(p, str) else list(p) for p in prompts]

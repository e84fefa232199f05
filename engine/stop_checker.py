"""Why a sequence stops after a sampled token: EOS, a stop token or string, or its length."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.request import Sequence


class StopChecker:
    def __init__(self, eos_token_ids: set[int], max_model_len: int) -> None:
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len

    def check(self, seq: Sequence, token: int) -> str | None:
        """Call after `token` was appended to seq's token ids. Feeds the token to seq's
        detokenizer unless the token itself stops the sequence (EOS and stop tokens add no text)."""
        params = seq.params
        if (
            (not params.ignore_eos and token in self.eos_token_ids)
            or token in params.stop_token_ids
            or seq.detok.append(token)
        ):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

"""A sequence's place in its grammar: fed every accepted token once, in order.

The matcher lives on the Sequence, so preemption (recompute) keeps it: recompute rebuilds KV only
and never re-appends tokens. n>1 children start from a copy of the parent's matcher."""

from __future__ import annotations

import llguidance as llg

from engine.structured.compiler import CompiledGrammar


class SequenceMatcher:
    def __init__(self, matcher: llg.LLMatcher) -> None:
        self.matcher = matcher

    @classmethod
    def start(cls, grammar: CompiledGrammar) -> SequenceMatcher:
        return cls(grammar.template.deep_copy())

    def copy(self) -> SequenceMatcher:
        return SequenceMatcher(self.matcher.deep_copy())

    def accept(self, token: int) -> bool:
        """Feeds one sampled token; False when the grammar rejects it (the matcher is then in
        its error state for good). Never call it on a terminated matcher."""
        return self.matcher.consume_token(token)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and takes no further token (EOS included)."""
        return self.matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    @property
    def error(self) -> str:
        return self.matcher.get_error() if self.matcher.is_error() else ""

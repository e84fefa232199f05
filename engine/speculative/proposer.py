"""Draft sources of one sequence, best expected gain first: the radix tree's continuation of its
tokens (mode "cache"), its own prompt and output (prompt lookup), the namespace's suffix index of
finished requests (mode "cache"). Each source is scoped by the sequence's namespace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.speculative.draft_length import FirstTokenRates
from engine.speculative.prompt_lookup import PromptLookup

if TYPE_CHECKING:
    from engine.kv import KVCacheManager
    from engine.request import Sequence
    from engine.speculative.config import SpecConfig
    from radixcache.suffix_index import SuffixIndex


@dataclass
class SeqDrafts:
    """A sequence's drafting state (Sequence.spec)."""

    lookup: PromptLookup
    first: FirstTokenRates = field(default_factory=FirstTokenRates)
    last_source: str = ""  # where the last draft came from
    # source -> (position, token): the first token a source would have drafted in a step it
    # did not draft, scored against the sampled one
    shadows: dict[str, tuple[int, int]] = field(default_factory=dict)


class DraftProposer:
    def __init__(
        self,
        config: SpecConfig,
        tree: KVCacheManager | None,
        suffix_index: SuffixIndex | None,
    ) -> None:
        self.config = config
        self.tree = tree  # None: no tree lookahead
        self.suffix_index = suffix_index  # None: no suffix index

    def state(self, seq: Sequence) -> SeqDrafts:
        if seq.spec is None:
            seq.spec = SeqDrafts(PromptLookup(self.config.ngram_sizes))
        return seq.spec

    def proposals(self, seq: Sequence, k: int) -> list[tuple[str, list[int]]]:
        """(source, up to k draft tokens to follow seq.token_ids) of every source that has any,
        in the sources' order."""
        state = self.state(seq)
        out = []
        for name, source in self._sources():
            draft = source(seq, state, k)
            if draft:
                out.append((name, draft))
        return out

    def _sources(self):  # noqa: ANN202 - (name, callable) pairs, in order
        if self.tree is not None:
            yield "tree", self._from_tree
        yield "ngram", self._from_own_tokens
        if self.suffix_index is not None:
            yield "suffix", self._from_suffix_index

    def _from_tree(self, seq: Sequence, state: SeqDrafts, k: int) -> list[int]:
        assert self.tree is not None
        return self.tree.lookahead(seq, k)

    @staticmethod
    def _from_own_tokens(seq: Sequence, state: SeqDrafts, k: int) -> list[int]:
        return state.lookup.propose(seq.token_ids, k)

    def _from_suffix_index(self, seq: Sequence, state: SeqDrafts, k: int) -> list[int]:
        assert self.suffix_index is not None
        return self.suffix_index.propose(seq.request.namespace, seq.token_ids, k)

"""The router's tokenizer: the model folder's tokenizer.json (torch-free) and its chat templates,
rendered by the very function the replicas' routes and engines use (radixcache/shared/chat_template.py:
same messages and tools -> same text; the text is encoded without adding special tokens), the
rendered text tokenized stretch by stretch (segment_tokenizer.py)."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from api.chat_template import ChatTemplates
from api.router.segment_tokenizer import SegmentTokenizer
from radixcache.shared.chat_template import ChatPrompt

Chat = ChatPrompt | list[dict[str, Any]]  # a prompt, or plain messages without tools


class PromptTokenizer:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.hf_tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(self.folder / "tokenizer.json")
        )
        self.templates = ChatTemplates.from_folder(self.folder)
        # the replicas' own backend (engine/loader/tokenizer.py loads tokenizer.json the same way)
        self.segments = SegmentTokenizer(Tokenizer.from_file(str(self.folder / "tokenizer.json")))

    def chat(self, messages: Chat) -> list[int]:
        return self.segments.encode(self.render(messages))

    def chat_for_routing(self, messages: Chat) -> tuple[array, str]:
        """The ids to route a chat on and the text still to tokenize after routing it. A chat whose
        leading stretches are held (a conversation's next turn: all but its last answer and new
        message) is routed on those when they cover at least half of the rendered text;
        otherwise it is tokenized whole (tail ""). `ids + segments.encode(tail)` is the prompt."""
        text = self.render(messages)
        ids, tail = self.segments.split_known(text)
        if tail and 2 * len(tail) > len(text):
            return ids + self.segments.encode_array(tail), ""
        return ids, tail

    def render(self, messages: Chat) -> str:
        prompt = messages if isinstance(messages, ChatPrompt) else ChatPrompt(list(messages))
        return self.templates.render(prompt)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if add_special_tokens:  # what the post-processor adds is the backend's business
            return self.segments.backend.encode(text).ids
        return self.segments.encode(text)

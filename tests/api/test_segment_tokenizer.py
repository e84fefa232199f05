"""The router's segmented tokenization: the same ids as the plain encode of the whole text, for
random chats and texts (added tokens, unicode, whitespace at the cuts), on the default model's and
the tiny models' tokenizers; configs that look across a cut fall back to the plain encode; a
conversation's next turn tokenizes only its new stretches."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

import api.router.segment_tokenizer as segment_module
from api.router.segment_tokenizer import SegmentTokenizer
from api.router.tokenize import PromptTokenizer

ADDED = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<reponame>", "<gh_stars>"]
EDGES = [" ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "<|im_", "|>", "<", "'s"]
UNICODE = ["\u00e9t\u00e9", "\u4e2d\u6587", "\U0001f600", "e\u0301", "\u0627\u0644", "123456"]
piece = st.one_of(
    st.text(max_size=24), st.sampled_from(ADDED), st.sampled_from(EDGES), st.sampled_from(UNICODE)
)
texts = st.lists(piece, max_size=12).map("".join)
chats = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": texts}
    ),
    min_size=1,
    max_size=6,
)
PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def prompt_tokenizers(default_model_path: Path, tiny_llama: Path) -> dict[str, PromptTokenizer]:
    return {"default": PromptTokenizer(default_model_path), "tiny": PromptTokenizer(tiny_llama)}


@pytest.fixture(scope="module")
def small_caches(prompt_tokenizers) -> dict[str, SegmentTokenizer]:
    """The same tokenizers with a cache of 3 stretches: they evict all the time."""
    return {
        name: SegmentTokenizer(p.segments.backend, max_stretches=3, max_tokens=64)
        for name, p in prompt_tokenizers.items()
    }


def plain(tok: SegmentTokenizer, text: str) -> list[int]:
    return tok.backend.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_the_model_tokenizers_are_segmented(prompt_tokenizers, name: str) -> None:
    tok = prompt_tokenizers[name].segments
    assert tok.segmented and tok.blockers == []


@pytest.mark.parametrize("name", ["default", "tiny"])
@PROPERTY
@given(text=texts)
def test_segmented_ids_equal_the_plain_encode_of_texts(
    prompt_tokenizers, small_caches, name, text
) -> None:
    tok = prompt_tokenizers[name].segments
    want = plain(tok, text)
    assert tok.encode(text) == want and tok.encode(text) == want  # a miss, then hits
    assert small_caches[name].encode(text) == want


@pytest.mark.parametrize("name", ["default", "tiny"])
@PROPERTY
@given(messages=chats)
def test_segmented_ids_equal_the_plain_encode_of_chats(prompt_tokenizers, name, messages) -> None:
    prompt = prompt_tokenizers[name]
    assert prompt.chat(messages) == plain(prompt.segments, prompt.render(messages))


def test_a_next_turn_tokenizes_only_its_new_stretches(default_model_path: Path) -> None:
    prompt = PromptTokenizer(default_model_path)
    history = [
        {"role": "system", "content": "You are a careful agent. " * 60},
        {"role": "user", "content": " What is a radix tree?\n"},
    ]
    prompt.chat(history)
    first = prompt.segments.stats()
    # system, "\n" between turns, user, "assistant\n" (the generation prompt)
    assert first["stretch_misses"] == 4
    history += [
        {"role": "assistant", "content": "A trie with merged edges."},
        {"role": "user", "content": "And its lookup cost?"},
    ]
    prompt.chat(history)
    second = prompt.segments.stats()
    assert second["stretch_misses"] - first["stretch_misses"] == 2  # the answer and the message
    assert second["stretch_hits"] - first["stretch_hits"] == 7
    prompt.chat(history)
    assert prompt.segments.stats()["stretch_misses"] == second["stretch_misses"]


@pytest.mark.parametrize("name", ["default", "tiny"])
@PROPERTY
@given(messages=chats, seen=st.integers(0, 6))
def test_the_known_ids_and_the_tail_make_the_prompt(
    prompt_tokenizers, name, messages, seen
) -> None:
    """split_known: ids of the leading stretches held, then the text after them; together
    they are the plain encode, whatever part of the chat was tokenized before."""
    prompt = prompt_tokenizers[name]
    prompt.segments.clear()
    if seen:
        prompt.chat(messages[:seen])
    text = prompt.render(messages)
    known, tail = prompt.segments.split_known(text)
    assert text.endswith(tail)
    assert known.tolist() + prompt.segments.encode(tail) == plain(prompt.segments, text)
    ids, rest = prompt.chat_for_routing(messages)
    assert ids.tolist() + prompt.segments.encode(rest) == plain(prompt.segments, text)
    known, tail = prompt.segments.split_known(text)
    assert known.tolist() == plain(prompt.segments, text) and tail == ""  # all held now


def test_a_next_turn_is_routed_on_what_was_seen(default_model_path: Path) -> None:
    prompt = PromptTokenizer(default_model_path)
    history = [
        {"role": "system", "content": "You are a careful agent. " * 60},
        {"role": "user", "content": "What is a radix tree?"},
    ]
    assert prompt.chat_for_routing(history)[1] == ""  # nothing held: tokenized whole
    seen = prompt.chat(history)
    history += [
        {"role": "assistant", "content": "A trie with merged edges."},
        {"role": "user", "content": "And its lookup cost?"},
    ]
    ids, tail = prompt.chat_for_routing(history)
    assert tail.startswith("assistant\nA trie with merged edges.") and tail.endswith("assistant\n")
    assert (
        ids.tolist() == seen[: len(ids)] and len(ids) >= len(seen) - 3
    )  # all but the generation prompt
    history[0]["content"] = "Short."  # the unseen part is most of the text: tokenized whole
    assert prompt.chat_for_routing(history)[1] == ""


def test_the_stretch_cache_is_bounded() -> None:
    tok = SegmentTokenizer(byte_level(), max_stretches=4, max_tokens=80)
    for i in range(20):
        tok.encode(f"<s>message {i}</s>\n")
    stats = tok.stats()
    assert stats["stretches_held"] <= 4 and stats["tokens_held"] <= 80
    long = "x" * 11  # over max_tokens // 8 ids: encoded, not kept
    assert tok.encode(f"<s>{long}") == plain(tok, f"<s>{long}")
    assert long not in tok._stretches


# --- the fallback decision, on small byte-level tokenizers built here ---
ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


def byte_level(
    pre: pre_tokenizers.PreTokenizer | None = None,
    normalizer: normalizers.Normalizer | None = None,
    added: list[str | AddedToken] | None = None,
) -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(ALPHABET)}, merges=[]))
    tok.pre_tokenizer = pre or pre_tokenizers.ByteLevel(add_prefix_space=False)
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.add_special_tokens(added or ["<s>", "</s>"])
    return tok


def metaspace(scheme: str) -> Tokenizer:
    vocab = {c: i for i, c in enumerate("\u2581abcdehlorswx<>/ 0123456789")}
    tok = Tokenizer(models.BPE(vocab={**vocab, "<unk>": len(vocab)}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


def truncated() -> Tokenizer:
    tok = byte_level()
    tok.enable_truncation(8)
    return tok


def special(**flags: bool) -> Tokenizer:
    return byte_level(added=[AddedToken("<s>", special=True, **flags), "</s>"])


CROSSES_THE_CUT: dict[str, tuple[Callable[[], Tokenizer], str]] = {
    "metaspace first": (lambda: metaspace("first"), "Metaspace"),
    "lstrip": (lambda: special(lstrip=True), "lstrip"),
    "rstrip": (lambda: special(rstrip=True), "rstrip"),
    "single_word": (lambda: special(single_word=True), "single_word"),
    "truncation": (truncated, "truncation"),
}
STAYS_EXACT: dict[str, Callable[[], Tokenizer]] = {
    "byte-level add_prefix_space": lambda: byte_level(pre_tokenizers.ByteLevel(True)),
    "prepend normalizer": lambda: byte_level(normalizer=normalizers.Prepend("\u0120")),
    "nfkc + lowercase": lambda: byte_level(
        normalizer=normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    ),
    "metaspace always": lambda: metaspace("always"),
    "digits + byte-level": lambda: byte_level(
        pre_tokenizers.Sequence([pre_tokenizers.Digits(True), pre_tokenizers.ByteLevel(False)])
    ),
}
WITNESS = "hello<s> world</s>x  <s> 12</s>"  # a cut next to letters, spaces and digits


@pytest.mark.parametrize("name", sorted(CROSSES_THE_CUT))
def test_a_config_that_crosses_the_cut_falls_back(name: str) -> None:
    build, reason = CROSSES_THE_CUT[name]
    tok = SegmentTokenizer(build())
    assert not tok.segmented and any(reason in r for r in tok.blockers), tok.blockers
    assert tok.encode(WITNESS) == plain(tok, WITNESS)
    if name != "truncation":  # cutting would be wrong here: the fallback is needed
        assert tok._segmented(WITNESS) != plain(tok, WITNESS)


@pytest.mark.parametrize("name", sorted(STAYS_EXACT))
@settings(max_examples=60, deadline=None)
@given(text=texts)
def test_a_config_that_stays_within_the_cut_is_segmented(name: str, text: str) -> None:
    tok = SegmentTokenizer(STAYS_EXACT[name]())
    assert tok.segmented, tok.blockers
    for t in (WITNESS, text.replace("<|im_start|>", "<s>").replace("<|im_end|>", "</s>")):
        assert tok.encode(t) == plain(tok, t)


def test_the_probe_catches_what_the_config_check_misses(monkeypatch) -> None:
    monkeypatch.setattr(segment_module, "config_blockers", lambda config, backend: [])
    tok = SegmentTokenizer(metaspace("first"))
    assert not tok.segmented and tok.blockers[0].startswith("probe ")
    assert SegmentTokenizer(byte_level()).segmented


def test_without_added_tokens_it_is_the_plain_encode() -> None:
    bare = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(ALPHABET)}, merges=[]))
    bare.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = SegmentTokenizer(bare)
    assert not tok.segmented and tok.blockers == ["no added tokens to cut at"]
    assert tok.encode(WITNESS) == plain(tok, WITNESS)


def test_the_router_imports_neither_engine_nor_torch() -> None:
    code = (
        "import sys, api.router.app; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'engine')]; "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

import subprocess
import sys

import numpy as np
import xxhash

from radixcache.hashing import Namespace, block_hashes

NS = Namespace("model-a", "bfloat16", 4)


def _reference(ns: Namespace, tokens: list[int], parent: int | None) -> list[int]:
    out, h = [], parent or 0
    for i in range(len(tokens) // ns.block_size):
        block = np.asarray(tokens[i * 4 : i * 4 + 4], dtype="<i4").tobytes()
        seed = ns.seed.to_bytes(8, "little") if parent is None and i == 0 else b""
        h = xxhash.xxh3_64_intdigest(h.to_bytes(8, "little") + seed + block)
        out.append(h)
    return out


def test_block_hashes_match_the_documented_formula():
    tokens = list(range(1000, 1018))
    assert block_hashes(NS, tokens) == _reference(NS, tokens, None)
    assert len(block_hashes(NS, tokens)) == 4  # partial tail block is not hashed


def test_chain_continues_from_parent_hash():
    tokens = list(range(50, 66))
    full = block_hashes(NS, tokens)
    assert block_hashes(NS, tokens[8:], parent_hash=full[1]) == full[2:]
    assert block_hashes(NS, tokens[:3]) == []


def test_numpy_and_list_inputs_agree():
    tokens = list(range(7, 31))
    assert block_hashes(NS, np.array(tokens, dtype=np.int64)) == block_hashes(NS, tokens)


def test_array_input_agrees_with_the_formula_at_block_size_1_and_4():
    from array import array

    tokens = [0, 256, 7, 0, 65536, 0, 0, 0, 3, 1 << 20, 0, 9]  # zero bytes at block ends
    for ns in (NS, Namespace("model-a", "bfloat16", 1)):
        want = _reference(ns, tokens, None) if ns.block_size == 4 else None
        got = block_hashes(ns, array("q", tokens))
        assert got == block_hashes(ns, tokens) == block_hashes(ns, np.array(tokens))
        assert want is None or got == want
        tail = block_hashes(ns, array("q", tokens[ns.block_size :]), parent_hash=got[0])
        assert tail == got[1:]


def test_namespace_fields_all_change_the_seed():
    variants = [
        NS,
        Namespace("model-b", "bfloat16", 4),
        Namespace("model-a", "float32", 4),
        Namespace("model-a", "bfloat16", 8),
        Namespace("model-a", "bfloat16", 4, layout_version=2),
        NS.with_salt("tenant-1"),
    ]
    assert len({v.seed for v in variants}) == len(variants)
    assert NS.with_salt("x") == Namespace("model-a", "bfloat16", 4, cache_salt="x")
    assert len(NS.hex) == 16 and int(NS.hex, 16) == NS.seed


def test_same_tokens_in_two_namespaces_hash_differently():
    tokens = list(range(16))
    a, b = block_hashes(NS, tokens), block_hashes(NS.with_salt("t"), tokens)
    assert not set(a) & set(b)


def test_hashes_are_deterministic_across_processes():
    code = (
        "from radixcache.hashing import Namespace, block_hashes;"
        "print(block_hashes(Namespace('model-a', 'bfloat16', 4), list(range(12))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(block_hashes(NS, list(range(12))))

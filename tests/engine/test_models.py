"""Parity of engine.models with transformers on tiny random-weight Llama-family configs (fp32)."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine.attention import build_attention_metadata, compute_positions, make_attention_backend
from engine.kv.paged_cache import KVCache
from engine.loader import load_model
from engine.models.config import ModelConfig
from engine.models.rope import rope_inv_freq

BLOCK_SIZE = 4
TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=160,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
CONFIGS = {
    "llama-tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True, rope_theta=500.0)),
    "llama-bias-llama3rope": (
        transformers.LlamaConfig,
        dict(
            attention_bias=True,
            mlp_bias=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=False)),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=32, tie_word_embeddings=True)),
    "mistral": (transformers.MistralConfig, dict(rope_theta=1e4, sliding_window=None)),
    # sliding windows shorter than the prompts: every layer; layer 1 only; head dim 256
    "mistral-window": (transformers.MistralConfig, dict(rope_theta=1e4, sliding_window=8)),
    "qwen2-window": (
        transformers.Qwen2Config,
        dict(use_sliding_window=True, sliding_window=11, max_window_layers=1),
    ),
    "mistral-window-d256": (transformers.MistralConfig, dict(head_dim=256, sliding_window=9)),
}


def randomize(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    cls, extra = CONFIGS[request.param]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cls(**TINY, **extra), dtype=torch.float32)
    randomize(hf)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf.eval(), load_model(path, torch.float32, "cpu")


def run_steps(model, steps: list[list[int]]) -> torch.Tensor:
    """Feed one sequence in chunks (prefill chunks then decode tokens); logits of every token."""
    kv = KVCache.for_model(model, 64, BLOCK_SIZE).tensor
    blocks = list(range(63, 0, -2))  # non-contiguous, descending block ids
    done, logits = 0, []
    for chunk in steps:
        done += len(chunk)
        meta = build_attention_metadata([len(chunk)], [done], [blocks], BLOCK_SIZE)
        pos = torch.from_numpy(compute_positions([len(chunk)], [done]))
        hidden = model(torch.tensor(chunk), pos, kv, meta)
        logits.append(model.compute_logits(hidden))
    return torch.cat(logits)


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].float()


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    scale = ref.abs().max().item()
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * scale)


def test_windowed_configs_are_not_full_attention(pair):
    """The same weights with the window widened past the prompt answer otherwise, so the
    windowed configs' parity below is the window's."""
    hf, ours = pair
    window = getattr(hf.config, "sliding_window", None)
    if not ours.config.has_windows:
        assert window is None
        return
    types = getattr(hf.config, "layer_types", None) or ["sliding_attention"] * 2  # Mistral: all
    assert ours.config.layer_windows == tuple(
        window if t == "sliding_attention" else None for t in types
    )
    wide = transformers.AutoModelForCausalLM.from_config(
        type(hf.config)(**{**hf.config.to_dict(), "sliding_window": 10_000}), dtype=torch.float32
    )
    wide.load_state_dict(hf.state_dict())
    ids = torch.randint(0, 160, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    diff = (hf_logits(hf, ids) - hf_logits(wide.eval(), ids)).abs().amax(-1)
    assert diff[:window].max() < 1e-4 and diff[window:].min() > 1e-3


def test_prefill_logits_match(pair):
    hf, ours = pair
    ids = torch.randint(0, 160, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    assert_close(run_steps(ours, [ids]), hf_logits(hf, ids))


def test_chunked_prefill_and_decode_logits_match(pair):
    hf, ours = pair
    ids = torch.randint(0, 160, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    steps = [ids[:7], ids[7:9], ids[9:21], *[[t] for t in ids[21:]]]
    assert_close(run_steps(ours, steps), hf_logits(hf, ids))


PATHS = {  # make_attention_backend arguments (beyond the device) of each CPU attention path
    "native": dict(native=True, dtype=torch.float32, prefill=True),  # even where torch is faster
    "native-decode": dict(native=True),
    "torch": dict(native=False),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_cpu_attention_path_matches_transformers(pair, path):
    """The native prefill and decode kernels, the native decode kernel with torch prefill, and
    the pure-torch path (their fallback) over the same steps, in float32."""
    hf, ours = pair
    ids = torch.randint(0, 160, (26,), generator=torch.Generator().manual_seed(4)).tolist()
    default = ours.attention
    ours.attention = make_attention_backend("cpu", head_dim=ours.config.head_dim, **PATHS[path])
    try:
        assert (ours.attention.native is not None) == (path != "torch")
        assert ours.attention.native_prefill == (path == "native")
        steps = [ids[:13], ids[13:17], *[[t] for t in ids[17:]]]
        assert_close(run_steps(ours, steps), hf_logits(hf, ids))
    finally:
        ours.attention = default


def test_greedy_generation_matches_transformers(pair):
    hf, ours = pair
    prompt = [5, 17, 33, 2, 99, 140, 7]
    ref = hf.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None
    )[0, len(prompt) :].tolist()
    kv = KVCache.for_model(ours, 16, BLOCK_SIZE).tensor
    seq, out = list(prompt), []
    chunk = prompt
    for _ in range(12):
        meta = build_attention_metadata([len(chunk)], [len(seq)], [list(range(16))], BLOCK_SIZE)
        pos = torch.arange(len(seq) - len(chunk), len(seq))
        hidden = ours(torch.tensor(chunk), pos, kv, meta)
        nxt = int(ours.compute_logits(hidden[-1:]).argmax())
        out.append(nxt)
        seq.append(nxt)
        chunk = [nxt]
    assert out == ref


def test_ragged_batch_equals_one_at_a_time(pair):
    """Prefill chunks with and without a cached prefix and decode tokens in one forward."""
    _, ours = pair
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 160, (n,), generator=gen).tolist() for n in (9, 14, 6, 11)]
    alone = [run_steps(ours, [s]) for s in seqs]
    kv = KVCache.for_model(ours, 64, BLOCK_SIZE).tensor
    tables = [list(range(i * 16, i * 16 + 16)) for i in range(4)]
    first = [5, 10, 6, 11]  # step 1: prefixes (seq 2 and 3 complete)
    second = [4, 4, 0, 0]  # step 2: seq 0 and 1 finish in chunks of 4 ... then decode below
    for cut in (first, second):
        done = [sum(x) for x in zip(first, *([second] if cut is second else []), strict=True)]
        lens = [c for c in cut if c]
        rows = [i for i, c in enumerate(cut) if c]
        ids = [t for i in rows for t in seqs[i][done[i] - cut[i] : done[i]]]
        meta = build_attention_metadata(
            lens, [done[i] for i in rows], [tables[i] for i in rows], BLOCK_SIZE
        )
        pos = torch.from_numpy(compute_positions(lens, [done[i] for i in rows]))
        logits = ours.compute_logits(ours(torch.tensor(ids), pos, kv, meta))
        ends = torch.cumsum(torch.tensor(lens), 0) - 1
        for j, i in enumerate(rows):
            assert_close(logits[ends[j]], alone[i][done[i] - 1])
    # one decode token for every sequence, in one batch
    nxt = [3, 4, 5, 6]
    meta = build_attention_metadata([1] * 4, [len(s) + 1 for s in seqs], tables, BLOCK_SIZE)
    pos = torch.tensor([len(s) for s in seqs])
    logits = ours.compute_logits(ours(torch.tensor(nxt), pos, kv, meta))
    for i, s in enumerate(seqs):
        assert_close(logits[i], run_steps(ours, [s + [nxt[i]]])[-1])


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 1e4},
        {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 5e5,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
            "rope_theta": 1e6,
        },
    ],
    ids=lambda r: r["rope_type"],
)
def test_rope_inv_freq_matches_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = transformers.LlamaConfig(
        **{**TINY, "max_position_embeddings": 16384}, rope_parameters=dict(rope)
    )
    ours, scaling = rope_inv_freq(ModelConfig.from_dict(hf_config.to_dict()))
    if rope["rope_type"] == "default":
        ref = 1.0 / (rope["rope_theta"] ** (torch.arange(0, 16, 2).float() / 16))
        ref_scaling = 1.0
    else:
        ref, ref_scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, "cpu")
    torch.testing.assert_close(ours, ref.float())
    assert scaling == pytest.approx(ref_scaling)


def test_native_bfloat16_prefill_and_decode_track_the_float32_reference(tmp_path):
    """bf16 serving path (native prefill + decode kernels) against transformers in float32."""
    cls, extra = CONFIGS["qwen3"]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cls(**TINY, **extra), dtype=torch.float32)
    randomize(hf)
    hf.save_pretrained(tmp_path)
    native = make_attention_backend("cpu", True, torch.bfloat16, extra["head_dim"], prefill=True)
    ours = load_model(tmp_path, torch.bfloat16, "cpu", attention=native)
    assert ours.attention.native_prefill and ours.attention.native is not None
    ids = torch.randint(0, 160, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    steps = [ids[:17], ids[17:30], *[[t] for t in ids[30:]]]
    logits = run_steps(ours, steps).float()
    ref = hf_logits(hf.eval(), ids)
    scale = ref.abs().max().item()
    torch.testing.assert_close(logits, ref, rtol=0.0, atol=0.08 * scale)
    # the same steps through the pure-torch path agree as closely
    ours.attention = make_attention_backend("cpu", native=False)
    torch_logits = run_steps(ours, steps).float()
    torch.testing.assert_close(logits, torch_logits, rtol=0.0, atol=0.08 * scale)


def test_default_backend_uses_the_native_kernels_where_they_pay(pair):
    """load_model picks the native decode kernel, and the native prefill kernel where it beats
    torch's on this CPU (native_prefill_pays); the parity tests above run both either way."""
    from engine.attention import native_prefill_pays
    from engine.dtypes import cpu_flags

    _, ours = pair
    flags = cpu_flags()
    assert ours.attention.native is not None
    assert ours.attention.native_prefill == native_prefill_pays(torch.float32, flags)
    bf16 = make_attention_backend("cpu", dtype=torch.bfloat16, head_dim=ours.config.head_dim)
    assert bf16.native is not None
    assert bf16.native_prefill == native_prefill_pays(torch.bfloat16, flags)
    assert not native_prefill_pays(torch.bfloat16, frozenset({"avx512_bf16", "amx_bf16"}))
    assert native_prefill_pays(torch.bfloat16, frozenset({"avx512_bf16", "avx512f"}))
    assert native_prefill_pays(torch.float32, frozenset({"avx2", "fma"}))
    assert not native_prefill_pays(torch.float32, frozenset({"avx2", "avx512f"}))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3072, 576), (576, 1536)])  # the default model's MLP
def test_an_invariant_packed_matmul_gives_a_row_the_same_bits_at_every_row_count(dtype, shape):
    """oneDNN switches kernels with the row count (on AMX CPUs a row's bits change from 64 rows
    on; on an AVX512-BF16 EPYC the 1,536-wide projection sums a lone row in another order):
    packed for a deterministic engine, a matmul runs within the probed range of row counts."""
    from engine.models.packed_linear import linear, pack_weight

    gen = torch.Generator().manual_seed(0)

    def wide(*size: int) -> torch.Tensor:  # magnitudes 2^-6..2^6: the order of sums shows
        scale = torch.exp2(torch.randint(-6, 7, size, generator=gen).float())
        return (torch.randn(*size, generator=gen) * scale).to(dtype)

    weight = wide(*shape)
    try:
        packed = pack_weight(weight, invariant=True)
    except RuntimeError as exc:  # oneDNN's bf16 path needs AVX512-BW/VL/DQ or AVX-NE-CONVERT:
        assert dtype is torch.bfloat16 and "cpu support" in str(exc)  # on an AVX2-only CPU
        return  # the model keeps its plain weights there (prepack returns False)
    assert 1 <= packed.min_rows <= packed.max_rows
    x = wide(700, shape[1])
    one_by_one = torch.cat([linear(x[i : i + 1], weight, None, packed) for i in range(700)])
    for m in (2, 5, 33, 64, 100, 577, 700):
        assert torch.equal(linear(x[:m], weight, None, packed), one_by_one[:m]), m


@pytest.mark.parametrize("shape", [(3072, 576), (576, 1536)])
def test_a_default_packed_matmul_sums_a_lone_row_as_a_call_of_several(shape):
    """Without deterministic mode a call keeps all its rows, but a lone row (a decode step of
    one sequence) is padded to this CPU's floor, so it gets the bits its row gets in a verify
    call of a few rows (speculation on and off then agree); on an AVX512-BF16 EPYC the
    1,536-wide projection sums a lone bf16 row in another order otherwise."""
    from engine.models.packed_linear import invariant_rows, linear, pack_weight, padded_rows

    gen = torch.Generator().manual_seed(1)
    scale = torch.exp2(torch.randint(-6, 7, (shape[0] + 40, shape[1]), generator=gen).float())
    wide = (torch.randn(shape[0] + 40, shape[1], generator=gen) * scale).to(torch.bfloat16)
    weight, x = wide[: shape[0]].contiguous(), wide[shape[0] :]
    try:
        packed = pack_weight(weight)
    except RuntimeError as exc:  # no oneDNN bf16 path on an AVX2-only CPU
        assert "cpu support" in str(exc)
        return
    assert packed.max_rows == 0  # calls stay whole
    _, cap = invariant_rows(*shape, torch.bfloat16)
    lone = torch.cat([linear(x[i : i + 1], weight, None, packed) for i in range(len(x))])
    for m in (2, 3, 9, 17, 40):
        if padded_rows(m) <= cap:
            assert torch.equal(linear(x[:m], weight, None, packed), lone[:m]), m


def test_packed_matmuls_see_few_row_counts_and_keep_every_row():
    from engine.models.packed_linear import linear, pack_weight, padded_rows

    assert [padded_rows(m) for m in (1, 2, 3, 5, 9, 16, 17, 64, 65, 72, 130, 257, 600, 1025)] == [
        1, 2, 4, 8, 12, 16, 20, 64, 80, 80, 144, 320, 640, 1280,
    ]  # fmt: skip
    assert len({padded_rows(m) for m in range(1, 2049)}) == 3 + 15 + 12 + 12 + 4
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=gen)
    packed = pack_weight(weight)
    for m in (1, 3, 17, 70):
        x = torch.randn(m, 32, generator=gen)
        out = linear(x, weight, None, packed)
        assert out.shape == (m, 48)
        torch.testing.assert_close(out, x @ weight.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_rms_norm_matches_transformers_and_keeps_each_row(dtype):
    """The native RMSNorm against transformers' formula (float32 statistics, rounded to the
    dtype before the weight), on strided rows; a row's bits are the same alone or among 100."""
    from engine.attention.native import load_native
    from engine.models.row_ops import NativeRowOps

    native = load_native()
    assert native is not None
    ops = NativeRowOps(native)
    gen = torch.Generator().manual_seed(3)
    wide = (torch.randn(100, 700, generator=gen) * 3).to(dtype)
    x, weight = wide[:, :576], torch.randn(576, generator=gen).to(dtype)  # rows strided 700
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = weight * hidden.to(dtype)
    got = ops.rms_norm(x, weight, 1e-6)
    torch.testing.assert_close(got, want)
    for i in (0, 37, 99):
        assert torch.equal(ops.rms_norm(x[i : i + 1], weight, 1e-6)[0], got[i])

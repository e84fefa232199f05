from radixcache import Namespace, PrefixCache
from radixcache.mrc import MissRatioCurve


def test_cyclic_scan_of_k_blocks():
    k = 200
    mrc = MissRatioCurve(sample_rate=1.0)
    for _ in range(20):
        for h in range(k):
            mrc.reference([h])
    assert mrc.hit_rate(k - 1) == 0.0  # LRU thrashes below k
    assert abs(mrc.hit_rate(k) - 19 / 20) < 1e-9  # everything after the first pass hits


def test_sampled_estimate_of_a_cyclic_scan():
    k = 4000
    mrc = MissRatioCurve(sample_rate=1 / 16)
    hashes = [(i * 0x9E3779B97F4A7C15) % 2**64 for i in range(k)]  # spread like real hashes
    for _ in range(10):
        for h in hashes:
            mrc.reference(mrc.sample([h]))
    assert mrc.hit_rate(int(k * 0.8)) < 0.05
    assert mrc.hit_rate(int(k * 1.2)) > 0.85


def test_prefix_cache_exposes_the_curve():
    bs = 16
    ns = Namespace("m", "float32", bs)
    k = 100  # blocks in the scan
    cache = PrefixCache(256, bs, mrc_sample_rate=1.0)
    requests = [list(range(i * bs, (i + 1) * bs)) for i in range(k)]
    for _ in range(6):
        for tokens in requests:
            m = cache.match(ns, tokens)
            if not m.block_ids:
                res = cache.insert(ns, tokens, cache.allocate(1))
                cache.free(res.duplicates)
    curve = {p.size_blocks: p.hit_rate for p in cache.stats().miss_ratio_curve}
    assert sorted(curve) == [64, 128, 256, 512, 1024, 2048]  # 0.25x..8x of the pool
    assert curve[64] == 0.0  # a 100-block scan thrashes 64 blocks
    assert abs(curve[128] - 5 / 6) < 1e-9 and curve[2048] == curve[128]
    assert PrefixCache(8, bs, mrc_sample_rate=None).stats().miss_ratio_curve == []

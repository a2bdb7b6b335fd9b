import numpy as np
import pytest

from dorylus_py.data import SynthConfig, generate
from dorylus_py.errors import ConfigError


def test_seeded_sizes_and_symmetry():
    cfg = SynthConfig(nodes=2_000, edges=30_000, features=8, classes=5, seed=7)
    g, h = generate(cfg), generate(cfg)
    assert np.array_equal(g.indices, h.indices) and np.array_equal(g.features, h.features)
    assert g.num_nodes == 2_000 and g.num_edges == 30_000 and g.num_features == 8 and g.num_classes == 5
    src, dst = g.edges()
    fwd = set(zip(src.tolist(), dst.tolist()))
    assert fwd == set(zip(dst.tolist(), src.tolist()))
    assert not (src == dst).any()
    assert generate(SynthConfig(nodes=2_000, edges=30_000, features=8, classes=5, seed=8)).indices.tolist() != g.indices.tolist()


def test_power_law_degrees_and_homophily():
    cfg = SynthConfig(nodes=20_000, edges=200_000, homophily=0.6, seed=1)
    g = generate(cfg)
    deg = g.in_degrees()
    assert deg.max() > 8 * deg.mean()  # heavy tail, unlike an Erdos-Renyi graph
    src, dst = g.edges()
    same = (g.labels[src] == g.labels[dst]).mean()
    expected = cfg.homophily + (1 - cfg.homophily) / cfg.classes
    assert abs(same - expected) < 0.03


def test_features_carry_label_signal():
    g = generate(SynthConfig(nodes=5_000, edges=20_000, feature_signal=0.5, seed=2))
    centroids = np.stack([g.features[g.labels == c].mean(0) for c in range(g.num_classes)])
    pred = np.argmax(g.features @ centroids.T - 0.5 * (centroids**2).sum(1), axis=1)
    assert (pred == g.labels).mean() > 0.5  # way above chance (0.1)


@pytest.mark.parametrize("cfg", [SynthConfig(nodes=1), SynthConfig(classes=1), SynthConfig(nodes=10, edges=1000),
                                 SynthConfig(homophily=1.5), SynthConfig(degree_exponent=1.0)])
def test_bad_config(cfg):
    with pytest.raises(ConfigError):
        generate(cfg)

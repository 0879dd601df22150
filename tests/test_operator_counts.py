"""A clock-free guard of the training speed: the ATen operators of one training step of
every wide architecture's ``_tiny`` preset against its stock twin at equal training FLOPs
(``benchmarks/operator_counts.py``; on a GPU each operator is a kernel launch, on the CPU a dispatch),
so that a change which adds work to either side shows in the fast tier, whatever the machine's
speed. The recorded figures are those of 2026-11-27 (docs/benchmarks.md, "Operators per step"); a
change that moves one by more than ``MARGIN`` either way updates them there and here, with its reason."""

import pytest

from testing_utils import benchmark

#: preset -> (its operators, its twin's, host waits, atomic adds) in one training step; the twin's
#: encoder depth is the one of equal training FLOPs (9, 6, 2, 2 and 3 layers).
RECORDED = {"multipath_transformer_tiny": (1553, 2624, 10, 2), "widenet_tiny": (1911, 1726, 6, 17),
            "scalable_transformer_tiny": (1099, 1038, 8, 2), "latent_depth_transformer_tiny": (1444, 1336, 8, 2),
            "partialformer_tiny": (1873, 1412, 8, 2)}
#: Relative change of a system's operators against its twin's that fails the guard: the counts are
#: deterministic, and 0.5 % is 8 operators of multi-path's 1,553 (one more elementwise op in the
#: multi-path FFN adds 12).
MARGIN = 0.005


@pytest.fixture(scope="module")
def counted():
    return benchmark("operator_counts", "--systems", ";".join(RECORDED))


@pytest.mark.parametrize("preset", RECORDED)
def test_operators_per_training_step_against_the_stock_twin(preset, counted):
    mine, twin, waits, atomic_adds = RECORDED[preset]
    measured = counted[preset]
    assert measured["operators"] / measured["twin"]["operators"] == pytest.approx(mine / twin, rel=MARGIN), measured
    assert measured["host_waits"] <= waits and measured["atomic_adds"] <= atomic_adds, measured

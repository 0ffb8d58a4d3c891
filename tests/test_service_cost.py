"""The service price of a step (engine.service_cost): its online estimate, how the planner values options at
it, and the engine learning it from the steps it commits."""

import numpy as np
import pytest

from dspark.config import SamplingParams
from dspark.service_cost import ServiceCost, ServiceCostEstimate
from test_engine_lossless import prompts_for
from test_engine_scheduling import make_engine, steep_table
from test_planner import cfg, plan
from tiny import tiny_drafter, tiny_target


def test_price_is_the_table_price_plus_extra_never_below_the_floor():
    cost = ServiceCost(floor_ms=3.0, extra_ms=0.5)
    assert cost.price(1.0) == 3.0 and cost.price(4.0) == 4.5
    assert np.array_equal(cost.price(np.array([1.0, 2.5, 4.0])), np.array([3.0, 3.0, 4.5]))
    assert ServiceCost.none().price(1.25) == 1.25 and not ServiceCost.none().active


def test_estimate_waits_for_enough_steps_then_follows_the_median_of_its_recent_steps():
    est = ServiceCostEstimate(window=3, min_steps=3)
    for _ in range(2):
        est.update(step_ms=5.0, table_ms=3.0, host_ms=1.0, waited_ms=1.0)
    assert est.current() == ServiceCost.none()  # two steps of each kind: not enough yet
    est.update(step_ms=5.0, table_ms=3.0, host_ms=1.0, waited_ms=1.0)
    assert est.current() == ServiceCost(floor_ms=1.0, extra_ms=2.0)
    est.update(step_ms=95.0, table_ms=3.0, host_ms=90.0, waited_ms=1.0)  # one stall moves neither
    assert est.current() == ServiceCost(floor_ms=1.0, extra_ms=2.0)
    for _ in range(2):  # the window (3 steps) now holds more slow steps than fast ones: it follows them
        est.update(step_ms=7.0, table_ms=3.0, host_ms=3.0, waited_ms=1.0)
    assert est.current() == ServiceCost(floor_ms=3.0, extra_ms=4.0)
    summary = est.summary()
    assert summary["service_cost/extra_steps"] == 6 and summary["service_cost/floor_ms"] == 3.0


def test_host_bound_steps_and_unpriced_steps_leave_the_extra_alone():
    """A step the host bounded (its commit did not wait for the device) says nothing about the device's
    time beyond the table; a step no table priced neither. A table that overprices gives no negative extra."""
    est = ServiceCostEstimate(window=1, min_steps=1)
    est.update(step_ms=9.0, table_ms=3.0, host_ms=9.0, waited_ms=0.0)
    est.update(step_ms=9.0, table_ms=None, host_ms=9.0, waited_ms=2.0)
    assert est.extra_steps == 0 and est.floor_steps == 2 and est.current() == ServiceCost(9.0, 0.0)
    est.update(step_ms=2.0, table_ms=3.0, host_ms=1.0, waited_ms=1.0)
    assert est.current() == ServiceCost(1.0, 0.0)
    with pytest.raises(ValueError, match="window"):
        ServiceCostEstimate(window=0)


def test_price_scales_the_table_price_and_stays_positive():
    cost = ServiceCost(floor_ms=1.0, extra_ms=2.0, scale=0.5)
    assert cost.price(4.0) == 4.0 and cost.price(0.5) == 2.25 and cost.active
    assert np.array_equal(cost.price(np.array([0.0, 4.0])), np.array([2.0, 4.0]))
    assert ServiceCost(extra_ms=-5.0, scale=0.0).price(3.0) == pytest.approx(1e-3)  # never 0: the planner divides


def test_estimate_reads_the_service_slope_when_the_table_prices_spread():
    """Device-bound steps whose period grows half as fast as the table's price (prefills beside them, launches
    the profile did not pay): the price follows the measured line, 0.5 T + 2, and an occasional stall does not
    move it. The line is refitted every ``refit_every`` device-bound steps."""
    est = ServiceCostEstimate(window=64, min_steps=8, refit_every=16)
    rng = np.random.default_rng(0)
    tables = rng.uniform(2.0, 6.0, 64)
    for i, t in enumerate(tables):
        stall = 40.0 if i % 16 == 5 else 0.0
        est.update(step_ms=0.5 * t + 2.0 + stall, table_ms=float(t), host_ms=1.0, waited_ms=0.5)
    cost = est.current()
    assert cost.scale == pytest.approx(0.5) and cost.extra_ms == pytest.approx(2.0) and cost.floor_ms == 1.0
    assert est.slope_fits == 1
    for t in tables[:15]:  # fewer than refit_every new steps: the same line, not refitted
        est.update(step_ms=t + 1.0, table_ms=float(t), host_ms=1.0, waited_ms=0.5)
        assert est.current() == cost and est.slope_fits == 1
    for t in tables[15:48]:  # three quarters of the window now follow T + 1: so does the price
        est.update(step_ms=t + 1.0, table_ms=float(t), host_ms=1.0, waited_ms=0.5)
        est.current()
    refit = est.current()
    assert est.slope_fits == 4 and refit.scale == pytest.approx(1.0) and refit.extra_ms == pytest.approx(1.0)
    assert est.summary()["service_cost/scale"] == est.current().scale


def test_a_falling_service_slope_is_clipped_to_flat_through_the_medians():
    est = ServiceCostEstimate(window=32, min_steps=4)
    for t in np.linspace(2.0, 6.0, 32):
        est.update(step_ms=10.0 - t, table_ms=float(t), host_ms=None, waited_ms=1.0)
    cost = est.current()
    assert cost.scale == 0.0 and cost.extra_ms == pytest.approx(6.0)  # every option costs the median period
    assert not plan(cfg(), service=cost).trimmed  # a trim saves nothing at a flat price


def test_planner_values_options_at_the_service_price():
    """STAIRS: the table alone trims to 3 drafts (+19% predicted). A fixed extra per step shrinks what a
    trim saves relative to the step: a small one keeps a smaller gain, a large one declines. A host floor
    above every device price makes every option cost the same, so the full block wins. The decision's
    ms stays the table's price, which the prediction check compares with the measured step."""
    table_only = plan(cfg())
    assert table_only.trimmed and table_only.windows == (3,) and table_only.predicted_gain == pytest.approx(3.4 / 2.5 / (4 / 3.5) - 1)
    small = plan(cfg(), service=ServiceCost(extra_ms=2.0))
    assert small.trimmed and small.windows == (3,)
    assert small.predicted_gain == pytest.approx((3.4 / 4.5) / (4.0 / 5.5) - 1) and small.predicted_gain < table_only.predicted_gain
    assert small.predicted_ms == table_only.predicted_ms == 2.5
    large = plan(cfg(), service=ServiceCost(extra_ms=10.0))
    assert not large.trimmed and large.reason == "declined_below_min_gain" and large.predicted_ms == 3.5
    floor = plan(cfg(), service=ServiceCost(floor_ms=3.5))
    assert not floor.trimmed and floor.windows == (4,)
    uniform = plan(cfg(mode="uniform"), service=ServiceCost(floor_ms=3.5))
    assert not uniform.trimmed
    # A service step whose time grows a tenth as fast as the table's: the trim saves a tenth of what the
    # table says, less than the acceptance it cuts.
    shallow = plan(cfg(), service=ServiceCost(extra_ms=3.0, scale=0.1))
    assert not shallow.trimmed and shallow.reason == "declined_below_min_gain"


def test_engine_learns_the_service_price_from_its_steps(tmp_path):
    """With engine.service_cost the engine counts every committed decode step in the estimate and plans with
    it; outputs are the verify-all engine's (greedy, fp32)."""
    target = tiny_target(7)
    drafter = tiny_drafter(target, 8, block_size=4)
    prompts = prompts_for(7, 6)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    base = make_engine(target, drafter, spec="dspark", verify="full")
    table = steep_table(base, tmp_path / "steep.json")
    expected = [o.token_ids for o in base.generate(prompts, params)]
    eng = make_engine(target, drafter, table, spec="dspark", verify="ragged", service_cost=True)
    assert [o.token_ids for o in eng.generate(prompts, params)] == expected
    c = eng.counters()
    assert c["service_cost/extra_steps"] == c["decode_steps"] > 8
    assert eng.planner.service == eng.service_cost.current()
    # the prediction check sees both prices: the table's, and the service price each decision was valued at
    assert c["sched/measured_ms_on_predicted"] > 0 and c["sched/predicted_ms_on_measured"] > 0
    assert c["sched/priced_ms_on_measured"] != pytest.approx(c["sched/predicted_ms_on_measured"])
    plain = make_engine(target, drafter, table, spec="dspark", verify="ragged")
    plain.generate(prompts, params)
    assert plain.service_cost is None and "service_cost/extra_ms" not in plain.counters()
    pc = plain.counters()  # without a service price the planner valued every step at the table's price
    assert pc["sched/predicted_ms_on_measured"] > 0
    assert pc["sched/priced_ms_on_measured"] == pytest.approx(pc["sched/predicted_ms_on_measured"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_theil_sen_slope_is_scipys(seed):
    """The refit's slope is scipy's Theil-Sen slope, ties in x (repeated table prices) included."""
    from scipy.stats import theilslopes

    from dspark.service_cost import theil_sen_slope

    rng = np.random.default_rng(seed)
    x = np.round(rng.uniform(1.0, 8.0, 64), 1)  # rounded: many equal table prices
    y = 1.4 * x + 0.3 + rng.standard_t(2, 64)  # heavy-tailed noise, as stalls make it
    assert theil_sen_slope(x, y) == pytest.approx(float(theilslopes(y, x)[0]), rel=1e-12, abs=1e-12)
    assert theil_sen_slope(np.full(4, 2.0), np.arange(4.0)) == 0.0  # no two different x: no slope

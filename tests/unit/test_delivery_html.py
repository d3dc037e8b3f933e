"""The page shows the delivery delay (the server's share of ITL) beside ITL: in a burst's results, in the A/B
table and in a replay's side panel; "unknown" where nothing was streamed, never a guess."""
from __future__ import annotations

import re
from types import SimpleNamespace

from batchscope.app.loadtest.statuses import ABStatus, BurstResults
from batchscope.app.ui.load_html import ab_compare_html
from batchscope.app.ui.page_html import replay_html, results_html

LAT = {"n": 10, "mean": 5.0, "p50": 5.0, "p90": 6.0, "p99": 9.0}


def _results(delivery: dict | None) -> BurstResults:
    tel = {"busy_basis": "events"} | ({"delivery_delay_ms": delivery} if delivery is not None else {})
    return BurstResults(ttft_ms=LAT, tpot_ms=LAT, itl_ms=LAT, e2e_ms=LAT, completed=4, failed=0, prompt_tokens=40,
                        output_tokens=36, duration_s=1.0, output_tokens_per_s=36.0, requests_per_s=4.0, telemetry=tel)


def test_a_burst_shows_its_delivery_delay_or_says_it_is_unknown():
    row = re.search(r'<tr class="bs-delivery".*?</tr>', results_html(_results({"n": 36, "p50": 0.42, "p90": 1.5,
                                                                              "p99": 12.25})), re.S).group(0)
    assert [c for c in re.findall(r"<td>(.*?)</td>", row)] == ["0.42", "1.50", "12.25"]
    empty = {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    for unknown in (empty, None):
        row = re.search(r'<tr class="bs-delivery".*?</tr>', results_html(_results(unknown)), re.S).group(0)
        assert re.findall(r"<td>(.*?)</td>", row) == ["unknown"] * 3


def test_the_ab_table_sets_the_delivery_delay_of_both_modes_side_by_side():
    ab = ABStatus.model_construct(sync=_results({"n": 9, "p50": 2.0, "p99": 40.0}),
                                  async_=_results({"n": 9, "p50": 1.0, "p99": 10.0}), speedup=None, valid=True,
                                  mode_changes=[])
    table = ab_compare_html(ab)
    p99 = re.search(r"delivery delay p99.*?</tr>", table, re.S).group(0)
    assert "40.00" in p99 and "10.00" in p99 and "better" in p99
    p50 = re.search(r"delivery delay p50.*?</tr>", table, re.S).group(0)
    assert "better" in p50                                        # 2 ms -> 1 ms: a millisecond saved
    quiet = ABStatus.model_construct(sync=_results({"n": 9, "p50": 0.6, "p99": 0.9}),
                                     async_=_results({"n": 9, "p50": 0.8, "p99": 9.0}), speedup=None, valid=True,
                                     mode_changes=[])
    table = ab_compare_html(quiet)
    # 0.6 vs 0.8 ms is the host's jitter, not "x1.33 worse"; 0.9 vs 9 ms is a real change
    assert "same" in re.search(r"delivery delay p50.*?</tr>", table, re.S).group(0)
    assert "worse" in re.search(r"delivery delay p99.*?</tr>", table, re.S).group(0)
    none = ABStatus.model_construct(sync=_results(None), async_=_results(None), speedup=None, valid=True,
                                    mode_changes=[])
    assert "delivery delay" not in ab_compare_html(none)         # neither streamed: no row of two blanks


def test_a_replay_panel_names_the_delivery_delay_only_when_the_recording_measured_it():
    def panel(delay):
        return replay_html(SimpleNamespace(replay={"meta": {"model": "m"}, "summary": {"delivery_delay_ms": delay}}))
    assert "delivery delay p50 / p99 ms</th><td>0.50 / 7.00<" in panel({"n": 3, "p50": 0.5, "p99": 7.0})
    assert "delivery delay" not in panel({"n": 0, "p50": None, "p99": None})

"""bench/relist.py end to end at a tiny size: the API restart makes every resource list again,
answers are checked throughout, and memory is sampled."""

from __future__ import annotations

import pytest

from bench.relist import Truth, cache_bounds, parse_args, run

pytestmark = pytest.mark.integration

TINY = ["--pods", "300", "--services", "20", "--slices", "20", "--nodes", "10",
        "--namespaces", "3", "--endpoints", "2-5", "--settle", "0.3", "--window", "0.3",
        "--after", "0.5", "--max-queries", "3000"]  # fmt: skip


@pytest.mark.parametrize("placement", ["cidrs", "pods"])
def test_a_restart_relists_and_answers_stay_right(placement: str) -> None:
    fill = ["--fill-caches", "100", "--memory-limit", "170"]
    result = run(parse_args([*TINY, "--placement", placement, *fill]))
    answers = result["answers"]
    assert answers["wrong"] == 0, answers["examples"]
    assert answers["right"] > 0
    [restart] = result["restarts"]
    assert restart["list_pages"] >= 4  # every resource listed again
    assert restart["peak"]["pss_mib"] > 0 and result["steady"]["pss_mib"] > 0
    assert result["fill_replies"] == 400  # each name asked twice, every reply came
    # The caches bounded as in a 170Mi container: an eighth, a sixteenth.
    assert cache_bounds(170) == ["--cache-max-bytes=22282240", "--forward-cache-max-bytes=11141120"]


def test_the_expected_answers() -> None:
    truth = Truth(
        cluster_ip={"a.": "10.96.0.1", "h.": None},
        by_zone={"h.": {"z1": {"10.0.0.1"}, "z2": {"10.0.0.2", "10.0.0.3"}}},
    )
    assert truth.expected("a.", "z1") == {"10.96.0.1"}
    assert truth.expected("h.", "z2") == {"10.0.0.2", "10.0.0.3"}
    # No endpoint in the client's zone: the policy's "*" tier, every endpoint.
    assert truth.expected("h.", "z3") == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}

"""The masked-aggregation benchmark (issue 35 item 4) still runs against the protocol: session 52 added a
field to every masked client message and the benchmark, which builds one, crashed for a whole session
unnoticed (no test ran it). Its smallest case, one repetition: ~2 s."""

import json
import logging

from benchmarks.secure_aggregation_cost.secure_aggregation_masked import main


def test_the_smallest_case_runs_and_its_masked_sum_is_the_plaintext_one(tmp_path):
    out = tmp_path / "masked.json"
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level  # the script quiets Flower's logger for its process; put back for this one
    try:
        main(["--no-flower", "--quick", "--case", "4:1000", "--reps", "1", "--party-reps", "1", "--out", str(out)])
    finally:
        flwr_logger.setLevel(level)
    case = json.loads(out.read_text())["cases"][0]
    assert (case["n"], case["P"]) == (4, 1000)
    ratio = case["per_party_floor"]["cpu"]["ratio_masked_over_floor"]
    assert ratio["server"] > 0 and ratio["client_median"] > 0
    assert case["relative_error_of_mean"]["masked"] < 1e-6, case["relative_error_of_mean"]
    assert case["vector_upload"]["masked"]["envelope_bytes"] > 0

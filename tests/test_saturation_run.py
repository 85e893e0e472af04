"""The client-saturation guard end to end: a real run whose single load process cannot keep up
is flagged in the summary, in ``run.json`` and as the ``client_saturated`` figure a gate can
require to be 0.

The load is 150 users of an emulator with no step cost, each reading 16 bytes per ``recv`` as
fast as it can (a reader made expensive on purpose: about 20 reads per event). Reading at full
speed no longer overloads the load process here: it takes events several times faster than
the emulator makes them (bench/RESULTS.md)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.lifecycle import run_scenario
from harness.runfolder import figures
from harness.scenario import Scenario

FLOOD = {
    "name": "flood",
    "max_duration_s": 90,
    "cooldown_s": 0.5,
    "target": {
        "kind": "sim",
        "engine": {
            "step_fixed_ms": 0.0, "decode_ms_per_seq": 0.0, "prefill_ms_per_token": 0.0,
            "num_blocks": 8192, "max_num_seqs": 512,
        },
    },
    "groups": [
        {"name": "flood", "users": 150, "requests_per_user": 2, "prompt_tokens": 8,
         "max_tokens": 400, "read": {"kind": "paced", "bytes_per_read": 16, "interval_s": 1e-6}},
    ],
}  # fmt: skip


def test_overloaded_client_run_is_flagged(tmp_path: Path) -> None:
    result = run_scenario(Scenario.model_validate(FLOOD), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    saturation = result.summary.client_saturation
    [process] = saturation.processes
    assert saturation.saturated and process.saturated, saturation
    assert process.over_any_fraction > 0.1
    # The load process was really busy: most of a core, or its hub ran late.
    assert process.cpu_max_pct > 85 or process.loop_lag_max_ms > 5
    assert saturation.message.startswith(
        "client saturated: latency figures unreliable (group flood: "
    )
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["client_saturation"]["saturated"] is True
    info = json.loads((result.run_dir / "run.json").read_text())
    assert info["client_saturated"] is True
    assert info["client_saturation"] == saturation.message
    assert figures(result.summary)["client_saturated"] == 1.0
    assert result.summary.groups[0].requests == 300

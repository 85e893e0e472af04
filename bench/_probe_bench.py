"""Engine probe overhead: vLLM's generation throughput on the tiny model with and without the
probe (``--scheduler-cls harness._engine_probe._vllm_scheduler.EngineProbe``).

Each trial is a fresh process running vLLM's offline engine (``vllm.LLM``, no HTTP server:
the scheduler is what differs) pinned to one core, generating ``--prompts`` completions of
``--max-tokens`` tokens each (``ignore_eos``) after a warm-up; tokens/s is generated tokens
over the wall time of ``LLM.generate``. Trials alternate off, on, off, on... so that drift on
a shared machine falls on both sides; the best trial of each side is compared.

    python bench/_probe_bench.py trials --repeats 3 --prompts 32 --max-tokens 900
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = "harness._engine_probe._vllm_scheduler.EngineProbe"


@dataclass(frozen=True)
class ProbeTrial:
    """One trial: ``probe`` on or off, generated tokens, tokens/s, the wall time of the timed
    ``generate`` (s), how many step rows the probe wrote, and the CPU time (s) the probe
    measured for itself over the engine's whole life (``engine_probe.json`` ``cost``: its code
    on the engine thread plus its flushing thread; 0 when off)."""

    probe: bool
    tokens: int
    tokens_per_s: float
    generate_s: float
    step_rows: int
    probe_cpu_s: float


def _one(probe: bool, prompts: int, max_tokens: int, model: str) -> dict[str, float]:
    """Run in the trial's own process: build the engine, warm up, time one generate."""
    from vllm import LLM, SamplingParams

    extra = {"scheduler_cls": PROBE} if probe else {}
    llm = LLM(
        model=model, max_model_len=1024, num_gpu_blocks_override=256, block_size=32,
        max_num_seqs=prompts, gpu_memory_utilization=0.1, **extra,
    )  # fmt: skip
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    texts = [f"request {i}: tell me about the sea" for i in range(prompts)]
    llm.generate(texts[:2], SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
    t0 = time.perf_counter()
    outputs = llm.generate(texts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"tokens": tokens, "tokens_per_s": tokens / elapsed, "generate_s": elapsed}


def trial(probe: bool, *, prompts: int, max_tokens: int, model: str, cpu: int) -> ProbeTrial:
    """One trial in a fresh process pinned to ``cpu`` (the probe writes into a temporary
    folder that is removed afterwards)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(cpu), "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        if probe:
            env["ZEROWINDOW_ENGINE_DIR"] = tmp
        argv = [
            "taskset", "-c", str(cpu), sys.executable, __file__, "one", "--prompts",
            str(prompts), "--max-tokens", str(max_tokens), "--model", model,
        ]  # fmt: skip
        if probe:
            argv.append("--probe")
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"probe bench trial failed: {done.stderr[-2000:]}")
        result = json.loads(lines[-1])
        rows, cpu_s = 0, 0.0
        if probe:
            import pandas as pd

            rows = len(pd.read_parquet(Path(tmp) / "engine_steps.parquet"))
            cost = json.loads((Path(tmp) / "engine_probe.json").read_text())["cost"]
            cpu_s = float(cost["engine_thread_s"]) + float(cost["flush_thread_s"])
    return ProbeTrial(
        probe, int(result["tokens"]), float(result["tokens_per_s"]), float(result["generate_s"]),
        rows, cpu_s,
    )  # fmt: skip


def run_trials(
    *, repeats: int = 3, prompts: int = 32, max_tokens: int = 900, model: str = "models/tiny",
    cpu: int = 0,
) -> list[ProbeTrial]:  # fmt: skip
    """``repeats`` rounds of (off, on)."""
    out = []
    for _ in range(repeats):
        for probe in (False, True):
            out.append(trial(probe, prompts=prompts, max_tokens=max_tokens, model=model, cpu=cpu))
            print(out[-1], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["trials", "one"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=900)
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--probe", action="store_true")
    args = parser.parse_args()
    if args.mode == "one":
        print(json.dumps(_one(args.probe, args.prompts, args.max_tokens, args.model)))
        return
    for t in run_trials(repeats=args.repeats, prompts=args.prompts, max_tokens=args.max_tokens,
                        model=args.model):  # fmt: skip
        print(t)


if __name__ == "__main__":
    main()

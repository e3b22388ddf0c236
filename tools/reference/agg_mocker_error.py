"""The aggregated engine model's error against Dynamo's mocker in aggregated mode.

Runs Dynamo's offline replay (`dynamo.replay.run_trace_replay`, the mocker engine's own
scheduler and timing) with a fixed pool of aggregated workers timed by the NPZ tables of
`planner-sim mocker-profile`, on constant-rate traces, and the simulator's aggregated engines
(`planner-sim simulate --aggregated` with the pool fixed by --min-replicas/--max-replicas) on
the same traces; prints mean TTFT and mean ITL of both and their relative difference.

Usage (from the repository root, after `make dynamo` and a release build of planner-sim):

    $(dynamo venv)/bin/python tools/reference/agg_mocker_error.py --planner-sim target/release/planner-sim

Nothing here is imported by the operator or the tests; it prints the figures docs/simulator.md
quotes.
"""

import argparse
import json
import math
import os
import random
import re
import subprocess
import tempfile

import numpy as np
from dynamo.replay import run_trace_replay

PROFILE = "h100-llama3.3-70b-tp4"
BLOCK = 64
CHUNK = 8192


def write_trace(path, rate, isl, osl, seconds, seed):
    """Poisson arrivals at `rate` requests/s of fixed lengths, as Mooncake JSONL (timestamps in
    ms), every prompt's blocks unique so no prefix is cached."""
    rng = random.Random(seed)
    t, block = 0.0, 0
    with open(path, "w") as f:
        while t < seconds:
            blocks = math.ceil(isl / BLOCK)
            f.write(
                json.dumps(
                    {
                        "timestamp": int(t * 1000),
                        "input_length": isl,
                        "output_length": osl,
                        "hash_ids": list(range(block, block + blocks)),
                    }
                )
                + "\n"
            )
            block += blocks
            t += rng.expovariate(rate)


def mocker(trace, npz, workers):
    kv_tokens = float(np.load(npz)["decode_active_kv_tokens"][-1])
    engine = {
        "engine": {
            "worker_type": "aggregated",
            "num_gpu_blocks": int(kv_tokens // BLOCK),
            "block_size": BLOCK,
            "max_num_batched_tokens": CHUNK,
            "enable_prefix_caching": False,
            "timing_model": {
                "type": "external",
                "provider": "dynamo_profile",
                "config": {"path": npz},
            },
        },
    }
    report = run_trace_replay(
        [trace],
        extra_engine_args=engine,
        num_workers=workers,
        router_mode="round_robin",
        trace_block_size=BLOCK,
        capture_per_request=True,
    )
    rows = [r for r in report.per_request if r.get("terminal_status") == "completed"]
    ttft = [r["ttft_ms"] for r in rows if r.get("ttft_ms") is not None]
    # Token-weighted mean ITL, as the simulator reports it.
    tokens = [(r.get("output_length") or 1) - 1 for r in rows]
    itl = [r["itl_ms"] for r in rows]
    weighted = sum(i * n for i, n in zip(itl, tokens) if i is not None and n > 0)
    count = sum(n for i, n in zip(itl, tokens) if i is not None and n > 0)
    return sum(ttft) / len(ttft), weighted / count if count else float("nan")


def simulator(planner_sim, trace, workers, ttft_ms, itl_ms):
    out = subprocess.run(
        [
            planner_sim, "simulate", "--trace", trace, "--profile", PROFILE, "--aggregated",
            "--chunk-tokens", str(CHUNK), "--min-replicas", str(workers), "--max-replicas",
            str(workers), "--policy", "fixed-peak", "--no-plots", "--jobs", "1",
            "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
        ],
        check=True, capture_output=True, text=True,
    ).stdout
    header = next(line for line in out.splitlines() if line.startswith("policy"))
    columns = re.split(r"\s{2,}", header.strip())
    row = next(line for line in out.splitlines() if line.startswith("oracle"))
    values = re.split(r"\s{2,}", row.strip())
    cell = dict(zip(columns, values))
    return float(cell["mean TTFT ms"]), float(cell["mean ITL ms"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--planner-sim", default="target/release/planner-sim")
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    cases = [
        # (rate req/s, ISL, OSL, workers)
        (1.0, 2000, 200, 1),
        (3.0, 2000, 200, 2),
        (6.0, 2000, 200, 4),
        (2.0, 8000, 100, 2),
        (4.0, 500, 500, 2),
        (8.0, 3000, 300, 8),
        # Busier engines: prompts take a third to a half of their time, queues form.
        (9.0, 3000, 300, 4),
        (4.0, 8000, 100, 4),
        (20.0, 1000, 400, 4),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "profile.npz")
        subprocess.run(
            [args.planner_sim, "mocker-profile", "--profile", PROFILE, "--out", npz],
            check=True, capture_output=True,
        )
        print("| rate req/s | ISL / OSL | engines | mocker TTFT / ITL ms | simulator TTFT / ITL ms | TTFT error | ITL error |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for i, (rate, isl, osl, workers) in enumerate(cases):
            trace = os.path.join(tmp, f"t{i}.jsonl")
            write_trace(trace, rate, isl, osl, args.seconds, seed=i)
            m_ttft, m_itl = mocker(trace, npz, workers)
            s_ttft, s_itl = simulator(args.planner_sim, trace, workers, 1e6, 1e6)
            print(
                f"| {rate} | {isl} / {osl} | {workers} | {m_ttft:.0f} / {m_itl:.1f} | "
                f"{s_ttft:.0f} / {s_itl:.1f} | {(s_ttft / m_ttft - 1) * 100:+.0f} % | "
                f"{(s_itl / m_itl - 1) * 100:+.0f} % |",
                flush=True,
            )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Replays the bench's runs in NVIDIA Dynamo's offline replay (`make bench-replay`).

Reads the manifest `planner-sim replay-traces` wrote and replays each run's trace with
Dynamo's mocker engines and router (`dynamo._core.run_mocker_trace_replay`), once per policy:

- `sla-arima`, `hpa`: this project's policies, asked every second through `planner-sim bridge`
  (`BridgePolicy`: the replay's tick snapshot becomes one JSON sample, the bridge answers the
  replicas);
- `sla-arima-capped`: `sla-arima` held to the GPU-hours `dynamo-throughput` spent on the same
  run (its result must be there: it runs after `dynamo-throughput`), through a GPU budget the
  harness sets every second from what is left of them (`GpuHourBudget`);
- `dynamo-throughput`, `dynamo-latency`, `dynamo-load`: Dynamo's own planner in the modes that
  run without AISimulate (`load` with the manifest's thresholds for the run), in the loop as
  Dynamo's replay runs it;
- `oracle-schedule`: the simulator's oracle's replicas interval by interval, each interval's
  asked for a start-up delay ahead (`OracleSchedule`): what meeting the SLA costs in these
  engines;
- `fixed-peak`: the manifest's fixed pool, without a scaling policy.

Writes `<results>/<run>/<policy>.json` (per request: arrival, lengths, TTFT, mean ITL; the
pools' workers over time) for `planner-sim replay-report`. Runs with the python of the virtual
environment `make dynamo` installs.
"""

import argparse
import bisect
import json
import math
import os
import subprocess
import sys
import time
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Dynamo's engines and planner log every tick (and warn at every scale-up while a worker starts); keep errors.
os.environ.setdefault("DYN_LOG", "error")
import standin  # noqa: E402

standin.install()

from dynamo._core import run_mocker_trace_replay  # noqa: E402
from dynamo.replay.planner import planner_replay_adapter  # noqa: E402

# In the order they run: `sla-arima-capped` reads `dynamo-throughput`'s result.
POLICIES = (
    "sla-arima",
    "hpa",
    "dynamo-throughput",
    "dynamo-latency",
    "dynamo-load",
    "sla-arima-capped",
    "oracle-schedule",
    "fixed-peak",
)
# The bridge's policy for each bridged one.
BRIDGED = {"sla-arima": "sla-arima", "hpa": "hpa", "sla-arima-capped": "sla-arima"}
CAPPED_AGAINST = "dynamo-throughput"
DYNAMO_MODES = {"dynamo-throughput": "throughput", "dynamo-latency": "latency", "dynamo-load": "load"}
# The bridge's sample: the simulator's step (1 s), fine enough for the fast checks (10 s) and
# the HPA's period (15 s).
SAMPLE_MS = 1000.0
# The replay's telemetry (the schedulers' gauges) for the bridge: five per sample.
GAUGE_MS = 200.0
# Policies stop ticking this long after the trace's last arrival. The replay can run as long as
# a policy asks for ticks: Mooncake conversation at k=4 was still ticking at 1.6 million virtual
# seconds with nothing in flight. A request still unfinished then counts as missing the SLA in
# its arrival's interval.
END_GRACE_MS = 600_000.0
# `sla-arima-capped` may spend its GPU-hours beyond one engine per pool at a rate that lasts
# this long (s): a scale-down waits for the planner's 300 s stabilisation window.
BUDGET_HORIZON_S = 300.0
# How long, after a budget cut, the workers above it may still be billed (s): until the
# planner's next interval check (60 s) and their draining.
BUDGET_COMMITTED_S = 90.0
# Share of the GPU-hours kept back for workers that drain for longer: a prefill worker cut while
# the router has queued prompts on it is billed until it has prefilled them all (in the replay
# before this reserve, up to 1.5 % of the run's GPU-hours, on Mooncake conversation k=4).
BUDGET_DRAIN_RESERVE = 0.02


class BridgeError(RuntimeError):
    """The bridge refused a sample or stopped."""


class BridgePolicy:
    """A `scaling_policy` for Dynamo's replay that asks `planner-sim bridge` every second.

    Each tick becomes one sample: the traffic counters of the tick's snapshot (the window since
    the last tick), and gauges from the replay's telemetry (`telemetry`, every
    `GAUGE_MS`): the requests waiting for or in prefill and in flight, the decode pool's KV
    usage at the tick, and the share of the prefill workers busy, averaged over the window's
    gauge samples (a sample taken at a random instant is busy with the probability the worker
    is, as a GPU's utilisation counter reads). The prompt lengths of the window's arrivals
    come from the trace, as a frontend sees each prompt on arrival.
    """

    def __init__(self, command, arrivals, budget=None):
        self.command = command
        self.budget = budget
        self.end_ms = (arrivals[-1][0] if arrivals else 0.0) + END_GRACE_MS
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.arrival_ms = [a[0] for a in arrivals]
        self.arrival_isl = [a[1] for a in arrivals]
        self.last_ms = 0.0
        self.gauges = None
        self.busy = []

    def initial_tick_ms(self):
        return SAMPLE_MS

    def telemetry(self, sample):
        """The replay's periodic telemetry: the schedulers' state at `sampled_at_ms`."""
        prefill = [m for m in sample["prefill_scheduler_metrics"] if m["worker_id"] in set(sample["active_prefill_ids"])]
        decode = [m for m in sample["decode_scheduler_metrics"] if m["worker_id"] in set(sample["active_decode_ids"])]
        # Waiting for or in prefill: the frontend's prefill stages, which the operator reads as
        # the queue (a request past prefill waiting for a decode worker is in flight only).
        prefilling = sum(m["running_requests"] + m["waiting_requests"] for m in prefill)
        prefilling += sample["router_pending_prefill_requests"]
        for_decode = sum(m["waiting_requests"] for m in decode) + sample["router_pending_decode_requests"]
        decoding = sum(m["running_requests"] for m in decode)
        self.gauges = {
            "queued": float(prefilling),
            "inflight": float(prefilling + for_decode + decoding),
            "decode_kv_usage": (
                sum(m["active_cache_usage"] for m in decode) / len(decode) if decode else None
            ),
        }
        if prefill:
            self.busy.append(sum(1 for m in prefill if m["running_requests"] > 0) / len(prefill))

    def on_tick(self, snapshot):
        now = float(snapshot["now_ms"])
        sample = self.sample(snapshot, now)
        self.proc.stdin.write(json.dumps(sample) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise BridgeError(f"{' '.join(self.command)} stopped (exit {self.proc.poll()})")
        answer = json.loads(line)
        self.last_ms = now
        return {
            "target_prefill": answer.get("prefill"),
            "target_decode": answer.get("decode"),
            "next_tick_ms": now + SAMPLE_MS if now < self.end_ms else None,
        }

    def sample(self, snapshot, now):
        traffic = snapshot.get("traffic") or {}

        def number(key):
            value = traffic.get(key)
            return float(value) if value is not None and math.isfinite(value) else 0.0

        first = bisect.bisect_left(self.arrival_ms, self.last_ms)
        last = bisect.bisect_left(self.arrival_ms, now)
        shapes, ttfts, itls = number("shape_count"), number("ttft_count"), number("itl_count")
        sample = {
            "t_s": now / 1000.0,
            "asked": [
                snapshot["non_draining_prefill_count"],
                snapshot["non_draining_decode_count"],
            ],
            "serving": [snapshot["active_prefill_count"], snapshot["active_decode_count"]],
            "arrivals": number("num_req"),
            "arrival_isl": self.arrival_isl[first:last],
            "completed": shapes,
            "osl_sum": number("avg_osl") * shapes,
            "ttft_count": ttfts,
            "ttft_sum_ms": number("avg_ttft_ms") * ttfts,
            "itl_count": itls,
            "itl_sum_ms": number("avg_itl_ms") * itls,
        }
        if self.gauges is not None:
            sample.update({k: v for k, v in self.gauges.items() if v is not None})
        if self.busy:
            sample["prefill_busy"] = sum(self.busy) / len(self.busy)
            self.busy = []
        if self.budget is not None:
            sample["max_gpu_budget"] = self.budget.update(now / 1000.0, held_workers(snapshot))
        return sample

    def close(self):
        if self.proc.stdin:
            self.proc.stdin.close()
        code = self.proc.wait()
        if code != 0:
            raise BridgeError(f"{' '.join(self.command)} exited with {code}")


def held_workers(snapshot):
    """Workers billed now per pool (active, starting and draining), as the report bills them."""
    held = []
    for pool in ("prefill", "decode"):
        count = snapshot.get(f"active_{pool}_count", 0)
        count += len(snapshot.get(f"starting_{pool}_ids") or [])
        count += len(snapshot.get(f"draining_{pool}_ids") or [])
        held.append(count)
    return held


class GpuHourBudget:
    """A GPU-hour budget over the run, spent as the policy chooses: at each sample, the GPU
    budget (`maxGpuBudget`) is one engine per pool plus the whole engines that what is left of
    the GPU-hours beyond that minimum to the run's end pays for over `BUDGET_HORIZON_S`, less
    what the workers held above the minimum will be billed before a cut takes effect
    (`BUDGET_COMMITTED_S`), and less `BUDGET_DRAIN_RESERVE` of them. So a policy that saves GPUs
    in calm spells may spend them on a burst, and over the run it holds about as many GPU-hours
    as `total_gpu_s`."""

    def __init__(self, total_gpu_s, end_s, gpus):
        self.total = total_gpu_s
        self.spendable = total_gpu_s * (1.0 - BUDGET_DRAIN_RESERVE)
        self.end_s = end_s
        self.gpus = gpus
        self.minimum = sum(gpus)
        self.used = 0.0
        self.last_s = 0.0
        self.held = None

    def update(self, now_s, workers):
        """The budget (GPUs) from `now_s`, with `workers` (prefill, decode) billed now."""
        if self.held is not None and now_s > self.last_s:
            self.used += self.held * (min(now_s, self.end_s) - min(self.last_s, self.end_s))
        self.last_s = max(self.last_s, now_s)
        self.held = sum(w * g for w, g in zip(workers, self.gpus))
        left_s = max(self.end_s - now_s, 0.0)
        committed = max(self.held - self.minimum, 0) * min(BUDGET_COMMITTED_S, left_s)
        slack = self.spendable - self.used - self.minimum * left_s - committed
        engine = max(self.gpus)
        extra = math.floor(max(slack, 0.0) / BUDGET_HORIZON_S / engine) * engine
        # What is held now stays affordable while the slack covers its commitment.
        if slack >= 0:
            extra = max(extra, self.held - self.minimum)
        return int(self.minimum + extra)


class OracleSchedule:
    """The simulator's oracle's replicas as a `scaling_policy`: at every second, the larger of
    the current interval's replicas and those of the interval a start-up delay ahead, so that
    each interval's workers serve when it begins and are released when it ends."""

    def __init__(self, schedule, interval_s, startup_s, end_ms):
        self.schedule = schedule
        self.interval_s = interval_s
        self.startup_s = startup_s
        self.end_ms = end_ms

    def initial_tick_ms(self):
        return SAMPLE_MS

    def target(self, now_s):
        def at(t):
            i = min(max(int(t // self.interval_s), 0), len(self.schedule) - 1)
            return self.schedule[i]

        now, ahead = at(now_s), at(now_s + self.startup_s)
        return [max(now[0], ahead[0]), max(now[1], ahead[1])]

    def on_tick(self, snapshot):
        now = float(snapshot["now_ms"])
        prefill, decode = self.target(now / 1000.0)
        return {
            "target_prefill": prefill,
            "target_decode": decode,
            "next_tick_ms": now + SAMPLE_MS if now < self.end_ms else None,
        }


class Bounded:
    """Dynamo's planner adapter, ticking until `end_ms` (`END_GRACE_MS`)."""

    def __init__(self, adapter, end_ms):
        self.adapter = adapter
        self.end_ms = end_ms

    def initial_tick_ms(self):
        return self.adapter.initial_tick_ms()

    def on_tick(self, snapshot):
        answer = dict(self.adapter.on_tick(snapshot))
        if float(snapshot["now_ms"]) >= self.end_ms:
            answer["next_tick_ms"] = None
        return answer

    def __getattr__(self, name):
        return getattr(self.adapter, name)


def engine_args(manifest, base, role, startup_s):
    engine = manifest["engine"]
    return {
        "engine": {
            "worker_type": role,
            "num_gpu_blocks": engine["num_gpu_blocks"],
            "block_size": engine["block_size"],
            "max_num_batched_tokens": engine["max_num_batched_tokens"],
            "max_model_len": engine["max_model_len"],
            "timing_model": {
                "type": "external",
                "provider": "dynamo_profile",
                "config": {"path": os.path.join(base, manifest["perf_data"])},
            },
        },
        "tensor_parallel_size": engine["tensor_parallel_size"],
        "startup_time": startup_s,
    }


def dynamo_planner_config(manifest, run, mode):
    """Dynamo's planner as a user would configure it for the run: its defaults but for the
    engines' GPUs, a GPU budget as loose as the simulator's policies' bounds (1 to 64 per pool;
    Dynamo's default of 8 GPUs would cap it at one 4-GPU engine per pool), no control API, and,
    in `load` mode, the manifest's thresholds for the run (Dynamo has no defaults for them).
    No `ttft_ms`/`itl_ms`: these modes ignore them (Dynamo says so in a warning), and with them
    set Dynamo 1.6.1's replay of `throughput` on Mooncake conversation k=4 stopped on its
    internal check on 5 of 5 attempts, against none of 2 without."""
    config = {
        "mode": "disagg",
        "optimization_target": mode,
        "backend": "mocker",
        "prefill_engine_num_gpu": manifest["gpus"][0],
        "decode_engine_num_gpu": manifest["gpus"][1],
        "max_gpu_budget": 64 * (manifest["gpus"][0] + manifest["gpus"][1]),
        "min_endpoint": 1,
        "control_api_port": 0,
    }
    if mode == "load":
        config.update(run["dynamo_load"])
    return config


def mean_gpus(result, manifest, run):
    """The GPUs `result`'s workers held on average over the run's intervals, as the report
    bills them (active, starting and draining workers from t = 0 to the last interval's end)."""
    end_s = run["intervals"] * manifest["interval_s"]
    held = 0.0
    for pool, gpus in enumerate(manifest["gpus"]):
        steps = sorted((row[0], row[2] + row[3] + row[4]) for row in result["timeline"] if int(row[1]) == pool)
        # Several changes at one instant: the last one holds.
        last = {}
        for t, workers in steps:
            last[t] = workers
        times = sorted(last)
        for i, t in enumerate(times):
            start = max(t, 0.0)
            end = min(times[i + 1] if i + 1 < len(times) else end_s, end_s)
            if end > start:
                held += gpus * last[t] * (end - start)
    return held / end_s if end_s > 0 else float("nan")


def capped_budget(directory, manifest, run):
    """`sla-arima-capped`'s GPU-hour budget: the GPU-seconds `dynamo-throughput` was billed
    over the run's intervals; `None` without its result."""
    path = os.path.join(directory, f"{CAPPED_AGAINST}.json")
    try:
        with open(path) as f:
            result = json.load(f)
    except FileNotFoundError:
        return None
    return mean_gpus(result, manifest, run) * run["intervals"] * manifest["interval_s"]


def read_arrivals(path):
    arrivals = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                arrivals.append((float(r["timestamp"]), float(r["input_length"])))
    arrivals.sort()
    return arrivals


def replay(manifest, base, run, policy, args, directory):
    trace = os.path.join(base, run["file"])
    prefill = engine_args(manifest, base, "prefill", args.startup_s)
    decode = engine_args(manifest, base, "decode", args.startup_s)
    initial = run["fixed_peak"] if policy == "fixed-peak" else run["initial"]
    common = dict(
        prefill_engine_args=prefill,
        decode_engine_args=decode,
        num_prefill_workers=initial[0],
        num_decode_workers=initial[1],
        sla_ttft_ms=run["ttft_ms"],
        sla_itl_ms=run["itl_ms"],
        capture_per_request=True,
        router_mode=args.router,
    )
    started = time.monotonic()
    if policy in BRIDGED:
        command = [
            args.bridge,
            "bridge",
            "--profile",
            manifest["profile"],
            "--policy",
            BRIDGED[policy],
            "--ttft-ms",
            str(run["ttft_ms"]),
            "--itl-ms",
            str(run["itl_ms"]),
            "--interval-s",
            str(manifest["interval_s"]),
        ]
        budget = None
        if policy == "sla-arima-capped":
            total = capped_budget(directory, manifest, run)
            budget = GpuHourBudget(total, run["intervals"] * manifest["interval_s"], manifest["gpus"])
        if args.bridge_log:
            os.makedirs(args.bridge_log, exist_ok=True)
            stem = run["file"].removesuffix(".jsonl")
            command += ["--log", os.path.join(args.bridge_log, f"{stem}-{policy}.jsonl")]
        bridge = BridgePolicy(command, read_arrivals(trace), budget)
        try:
            native = run_mocker_trace_replay(
                [trace],
                scaling_policy=bridge,
                telemetry_sample_interval_ms=GAUGE_MS,
                telemetry_callback=bridge.telemetry,
                **common,
            )
        finally:
            bridge.close()
        description = " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(command))
        if budget is not None:
            description += f" (GPU budget set every second from {budget.total / 3600.0:.2f} GPU-hours over the run)"
    elif policy in DYNAMO_MODES:
        config = dynamo_planner_config(manifest, run, DYNAMO_MODES[policy])
        with planner_replay_adapter(
            extra_engine_args=None,
            prefill_engine_args=prefill,
            decode_engine_args=decode,
            planner_config_arg=json.dumps(config),
            capture_details=False,
        ) as adapter:
            arrivals = read_arrivals(trace)
            end_ms = (arrivals[-1][0] if arrivals else 0.0) + END_GRACE_MS
            native = run_mocker_trace_replay([trace], scaling_policy=Bounded(adapter, end_ms), **common)
        description = "Dynamo planner " + json.dumps(config, sort_keys=True)
    elif policy == "oracle-schedule":
        arrivals = read_arrivals(trace)
        end_ms = (arrivals[-1][0] if arrivals else 0.0) + END_GRACE_MS
        schedule = run["oracle_schedule"]
        native = run_mocker_trace_replay(
            [trace],
            scaling_policy=OracleSchedule(schedule, manifest["interval_s"], args.startup_s, end_ms),
            **common,
        )
        description = f"the simulator's oracle's replicas per interval, asked {args.startup_s:g} s ahead"
    elif policy == "fixed-peak":
        native = run_mocker_trace_replay([trace], scaling_policy=None, **common)
        description = f"fixed pool {initial[0]}P/{initial[1]}D"
    else:
        raise ValueError(f"unknown policy {policy}")
    wall = time.monotonic() - started
    return {
        "policy": policy,
        "description": description,
        "dynamo_version": metadata.version("ai-dynamo"),
        "startup_s": args.startup_s,
        "router": args.router,
        "wall_s": wall,
        "requests": [request_row(r) for r in native.per_request],
        "timeline": timeline(initial, native.lifecycle_operations),
    }


# Dynamo 1.6.1's disaggregated replay now and then stops on an internal check ("replay invariant
# violated: ... effect-free zero-duration pass"), on a sequence of scaling decisions that a
# second replay of the same run and policy goes through (the KV router is not repeatable to the
# last digit); on Mooncake conversation k=4 it stopped `sla-arima` once and
# `dynamo-throughput` three times in a row. After `ATTEMPTS` such stops the policy is left out
# of that run, and `<policy>.failed` says why (the report lists it).
INVARIANT = "replay invariant violated"
ATTEMPTS = 5


def replay_retrying(manifest, base, run, policy, args, directory):
    """`replay`, again (up to `ATTEMPTS` in all) when Dynamo's replay stops on `INVARIANT`;
    `None` when every attempt did."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return replay(manifest, base, run, policy, args, directory)
        except Exception as e:  # the replay raises a bare Exception
            if INVARIANT not in str(e):
                raise
            print(f"{run['name']} {policy}: attempt {attempt} stopped ({e})", file=sys.stderr, flush=True)
            last = str(e)
    with open(os.path.join(directory, f"{policy}.failed"), "w") as f:
        f.write(f"Dynamo's replay stopped on each of {ATTEMPTS} attempts: {last}\n")
    return None


def finite(value):
    return float(value) if value is not None and math.isfinite(float(value)) else None


def request_row(r):
    completed = r.get("terminal_status") == "completed"
    return [
        finite(r["arrival_time_ms"]),
        finite(r["input_length"]),
        finite(r.get("output_length") or r.get("requested_output_length")),
        finite(r.get("ttft_ms")),
        finite(r.get("itl_ms")),
        1.0 if completed else 0.0,
    ]


def timeline(initial, operations):
    rows = [[0.0, 0, initial[0], 0, 0], [0.0, 1, initial[1], 0, 0]]
    for op in operations:
        pool = {"prefill": 0, "decode": 1}.get(op["pool"])
        if pool is None:
            continue
        state = op["state_after_batch"]
        rows.append(
            [
                float(op["at_ms"]) / 1000.0,
                pool,
                len(state["active"]),
                len(state["starting"]),
                len(state["draining"]),
            ]
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", required=True, help="manifest.json of planner-sim replay-traces")
    parser.add_argument("--bridge", required=True, help="the planner-sim binary")
    parser.add_argument("--results", help="output directory (default: results beside the manifest)")
    parser.add_argument("--startup-s", type=float, default=60.0, help="scale-up delay of new workers (s)")
    parser.add_argument(
        "--router",
        choices=("kv_router", "round_robin"),
        default="kv_router",
        help="Dynamo's router: its KV- and load-aware router (default), or round robin",
    )
    parser.add_argument("--policy", action="append", choices=POLICIES, help="policies (default: all)")
    parser.add_argument("--bridge-log", help="directory for the bridge's log of every check (planner-sim bridge --log)")
    parser.add_argument("--run", action="append", help="runs by name, e.g. 'azure2023_code k=1' (default: all)")
    args = parser.parse_args()

    with open(args.manifest) as f:
        manifest = json.load(f)
    base = os.path.dirname(os.path.abspath(args.manifest))
    results = args.results or os.path.join(base, "results")
    policies = sorted(set(args.policy or POLICIES), key=POLICIES.index)
    runs = [r for r in manifest["runs"] if not args.run or r["name"] in args.run]
    if args.run and len(runs) != len(args.run):
        known = ", ".join(r["name"] for r in manifest["runs"])
        parser.error(f"--run must name runs of the manifest: {known}")
    for run in runs:
        directory = os.path.join(results, run["file"].removesuffix(".jsonl"))
        os.makedirs(directory, exist_ok=True)
        for policy in policies:
            stale = os.path.join(directory, f"{policy}.failed")
            if os.path.exists(stale):
                os.remove(stale)
            if policy == "sla-arima-capped" and capped_budget(directory, manifest, run) is None:
                with open(stale, "w") as f:
                    f.write(f"no `{CAPPED_AGAINST}` replay of this run to take the GPU budget from\n")
                continue
            result = replay_retrying(manifest, base, run, policy, args, directory)
            if result is None:
                continue
            with open(os.path.join(directory, f"{policy}.json"), "w") as f:
                json.dump(result, f, allow_nan=False)
            print(
                f"{run['name']:<36} {policy:<18} {len(result['requests']):>6} requests "
                f"in {result['wall_s']:6.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()

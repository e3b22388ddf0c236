#!/usr/bin/env python3
"""Reference forecasts for the Rust load predictors (operator/src/planner/predictor/).

Runs the Python libraries that NVIDIA Dynamo's SLA planner uses (pmdarima 2.1.1,
filterpy 1.4.5, prophet 1.2.1) on fixed series and writes what they return to
crates/planner-core/tests/fixtures/predictor_reference.json, which crates/planner-core/src/predictor/parity.rs
compares against. The predictor semantics driven here (leading-zero skip, NaN -> 0, the
ARIMA "(0,d,0) -> log1p" refit, Kalman local linear trend) follow
shared/notes/dynamo-reference.md section 2.7; this harness is written from that description.

Set-up and run (from the repository root, with shared/ beside it):

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install pmdarima==2.1.1 filterpy==1.4.5 prophet==1.2.1
    /tmp/refvenv/bin/python tools/reference/predictors_reference.py

It takes a few minutes (mostly Prophet fits and pmdarima updates).
"""

import csv
import json
import logging
import math
import os
import sys
import warnings
from datetime import datetime, timedelta

import numpy as np

warnings.filterwarnings("ignore")
for name in ("prophet", "cmdstanpy"):
    logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger(name).propagate = False

import filterpy  # noqa: E402
import pandas as pd  # noqa: E402
import pmdarima  # noqa: E402
import prophet  # noqa: E402
import statsmodels  # noqa: E402
from filterpy.kalman import KalmanFilter  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = os.path.join(REPO, "..", "shared", "data", "traces")
OUT = os.path.join(REPO, "crates", "planner-core", "tests", "fixtures", "predictor_reference.json")


# ---------------------------------------------------------------------------
# Series
# ---------------------------------------------------------------------------

def azure_arrivals(name):
    """(seconds since first request, context tokens) from an Azure 2023 trace."""
    rows = []
    with open(os.path.join(TRACES, name)) as f:
        for row in csv.DictReader(f):
            ts = row["TIMESTAMP"][:26]  # %f takes 6 fractional digits, the file has 7
            rows.append((datetime.strptime(ts, "%Y-%m-%d %H:%M:%S.%f"), float(row["ContextTokens"])))
    t0 = rows[0][0]
    return [((t - t0).total_seconds(), isl) for t, isl in rows]


def per_interval(arrivals, interval):
    """Request count and mean ISL per interval, zero-filled as Prometheus would report them
    (an empty interval has count 0 and an ISL of 0/0 = NaN)."""
    n = int(arrivals[-1][0] // interval)  # full intervals only
    counts = [0.0] * n
    sums = [0.0] * n
    for t, isl in arrivals:
        i = int(t // interval)
        if i < n:
            counts[i] += 1
            sums[i] += isl
    isl = [s / c if c else float("nan") for s, c in zip(sums, counts)]
    return counts, isl


def mooncake_counts(name, interval):
    arrivals = []
    with open(os.path.join(TRACES, name)) as f:
        for line in f:
            rec = json.loads(line)
            arrivals.append((rec["timestamp"] / 1000.0, float(rec["input_length"])))
    return per_interval(arrivals, interval)[0]


def servegen(model, n):
    out = []
    with open(os.path.join(TRACES, "servegen_aggregate_10min.csv")) as f:
        for row in csv.DictReader(f):
            if row["model"] == model:
                out.append(float(row["requests_in_window"]))
    return out[:n]


def build_series():
    rng = np.random.RandomState(20261122)
    code = azure_arrivals("azure2023_code.csv")
    conv = azure_arrivals("azure2023_conv.csv")
    code60, code_isl60 = per_interval(code, 60)
    conv60, _ = per_interval(conv, 60)
    conv10, _ = per_interval(conv, 10)
    t = np.arange(100)
    trend = 50 + 2 * t + rng.normal(0, 5, size=t.size)
    t2 = np.arange(120)
    seasonal = 100 + 30 * np.sin(2 * np.pi * t2 / 24) + rng.normal(0, 5, size=t2.size)
    return {
        "azure_code_req_60s": (60, "Azure 2023 code trace, requests per 60 s (zero-filled)", code60),
        "azure_code_isl_60s": (60, "Azure 2023 code trace, mean ISL per 60 s (NaN when empty)", code_isl60),
        "azure_conv_req_60s": (60, "Azure 2023 conversation trace, requests per 60 s", conv60),
        "azure_conv_req_10s": (10, "Azure 2023 conversation trace, requests per 10 s", conv10),
        "mooncake_conv_req_30s": (30, "Mooncake conversation trace, requests per 30 s",
                                  mooncake_counts("mooncake_conversation_trace.jsonl", 30)),
        "servegen_mlarge_600s": (600, "ServeGen m-large, requests per 600 s window (first 480)",
                                 servegen("m-large", 480)),
        "synthetic_trend": (180, "50 + 2t + N(0, 5), seed 20261122", trend.tolist()),
        "synthetic_seasonal": (180, "100 + 30 sin(2 pi t / 24) + N(0, 5), seed 20261122", seasonal.tolist()),
    }


# ---------------------------------------------------------------------------
# Predictor semantics (reference section 2.7)
# ---------------------------------------------------------------------------

class IdleSkip:
    """NaN -> 0, and zeros are dropped until the first non-zero value."""

    def __init__(self):
        self.seen_nonzero = False

    def accept(self, value):
        value = 0.0 if math.isnan(value) else float(value)
        if value == 0.0 and not self.seen_nonzero:
            return None
        if value != 0.0:
            self.seen_nonzero = True
        return value


def auto_arima(y):
    return pmdarima.auto_arima(y, suppress_warnings=True, error_action="ignore")


def describe(model):
    return {
        "order": list(model.order),
        "with_intercept": bool(model.with_intercept),
        "aic": float(model.aic()),
        "params": [float(v) for v in model.params()],
    }


def arima_predictor(values, log1p, warmup):
    """Upstream ARIMA predictor: fit once (auto_arima) when >= 5 distinct points exist, refit on
    log1p(y) if raw mode selects (0,d,0), then `update` with each new point. `warmup` points are
    added before the first prediction (as the warm-up trace does)."""
    skip = IdleSkip()
    raw = []
    pending = []
    model = None
    mode_log = log1p
    forecasts = []
    info = {}
    for i, v in enumerate(values):
        accepted = skip.accept(v)
        if accepted is not None:
            raw.append(max(0.0, accepted))
            pending.append(max(0.0, accepted))
        if i + 1 < warmup:
            continue
        if len(raw) < 5:
            forecasts.append(raw[-1] if raw else 0.0)
            continue
        if len(set(raw)) == 1:
            forecasts.append(raw[0])
            continue
        try:
            if model is None:
                mode_log = log1p
                model = auto_arima([math.log1p(x) for x in raw] if mode_log else list(raw))
                info["first_fit_at"] = len(raw)
                info["first_order"] = list(model.order)
                p, _, q = model.order
                if p == 0 and q == 0 and not log1p:
                    model = auto_arima([math.log1p(x) for x in raw])
                    mode_log = True
                    info["collapsed_to_log1p"] = True
                info["order"] = list(model.order)
                info["with_intercept"] = bool(model.with_intercept)
            elif pending:
                model.update([math.log1p(x) for x in pending] if mode_log else pending)
            pending = []
            f = float(model.predict(n_periods=1)[0])
            forecasts.append(max(0.0, math.expm1(f)) if mode_log else max(0.0, f))
        except Exception as e:  # noqa: BLE001 - upstream falls back on any error
            pending = []
            info.setdefault("errors", []).append(f"{i}: {e}")
            forecasts.append(raw[-1])
    info["log1p_mode_at_end"] = mode_log
    if model is not None:
        info["final_params"] = [float(v) for v in model.params()]
    return forecasts, info


def kalman_predictor(values, log1p, q_level=1.0, q_trend=0.1, r=10.0):
    """Local linear trend filter as in section 2.7 (filterpy), predicting after every point.
    Returns the filter's own forecast (min_points is applied on the Rust side)."""
    skip = IdleSkip()
    kf = KalmanFilter(dim_x=2, dim_z=1)
    kf.x = np.array([[0.0], [0.0]])
    kf.F = np.array([[1.0, 1.0], [0.0, 1.0]])
    kf.H = np.array([[1.0, 0.0]])
    kf.P *= 1000.0
    kf.R = np.array([[max(1e-9, r)]])
    kf.Q = np.array([[max(1e-12, q_level), 0.0], [0.0, max(1e-12, q_trend)]])
    initialized = False
    cached = None
    last = 0.0
    out = []
    for v in values:
        accepted = skip.accept(v)
        if accepted is not None:
            last = accepted
            z = math.log1p(max(0.0, accepted)) if log1p else accepted
            if not initialized:
                kf.x = np.array([[z], [0.0]])
                initialized = True
            else:
                if cached is None:
                    kf.predict()
                kf.update(np.array([[z]]))
            cached = None
        if not initialized:
            out.append(last)
            continue
        if cached is None:
            kf.predict()
            cached = float(kf.x[0][0])
        out.append(max(0.0, math.expm1(cached)) if log1p else cached)
    return out


def prophet_fit(values, interval, log1p):
    """Default Prophet on a window, timestamps stepping by `interval` seconds (the upstream bug of
    stepping the forecast timestamp by 1 s is not reproduced), forecasting one step ahead."""
    start = datetime(2024, 1, 1)
    ys = [math.log1p(max(0.0, v)) if log1p else v for v in values]
    df = pd.DataFrame({"ds": [start + timedelta(seconds=i * interval) for i in range(len(ys))], "y": ys})
    m = prophet.Prophet()
    m.fit(df)
    future = pd.DataFrame({"ds": [start + timedelta(seconds=len(ys) * interval)]})
    yhat = float(m.predict(future)["yhat"].iloc[0])
    return max(0.0, math.expm1(yhat)) if log1p else yhat


def clean(values):
    """What the predictors store: NaN -> 0 and leading zeros dropped."""
    skip = IdleSkip()
    return [a for a in (skip.accept(v) for v in values) if a is not None]


def main():
    series = build_series()
    out = {
        "generator": "tools/reference/predictors_reference.py",
        "versions": {
            "python": sys.version.split()[0],
            "pmdarima": pmdarima.__version__,
            "statsmodels": statsmodels.__version__,
            "numpy": np.__version__,
            "filterpy": filterpy.__version__,
            "prophet": prophet.__version__,
        },
        "series": {},
        "arima_fits": [],
        "arima_predictor": [],
        "kalman_predictor": [],
        "prophet_fits": [],
    }
    for name, (interval, desc, values) in series.items():
        out["series"][name] = {
            "interval_seconds": interval,
            "description": desc,
            # NaN is not JSON: written as null, read back as NaN.
            "values": [None if (isinstance(v, float) and math.isnan(v)) else v for v in values],
        }

    # 1. Fresh auto_arima fits at cut points (order selection parity).
    for name, (_, _, values) in series.items():
        y = clean(values)
        cuts = sorted({c for c in (8, 12, 20, 30, 45, 60, 90, 150, 240, 480) if c <= len(y)} | {len(y)})
        for n in cuts:
            for log1p in (False, True):
                data = [math.log1p(max(0.0, v)) for v in y[:n]] if log1p else y[:n]
                if len(set(data)) == 1:
                    continue
                try:
                    m = auto_arima(data)
                except Exception as e:  # noqa: BLE001
                    print(f"arima fit {name} n={n} log1p={log1p}: {e}", file=sys.stderr)
                    continue
                entry = {"series": name, "n": n, "log1p": log1p}
                entry.update(describe(m))
                entry["forecast"] = float(m.predict(n_periods=1)[0])
                out["arima_fits"].append(entry)
                print(f"arima fit {name} n={n} log1p={log1p}: {entry['order']} "
                      f"c={entry['with_intercept']} f={entry['forecast']:.4f}", file=sys.stderr)

    # 2. The predictor as the planner drives it: from the first point, and after a warm-up.
    runs = [
        ("azure_code_req_60s", 0), ("azure_code_isl_60s", 0), ("azure_conv_req_60s", 0),
        ("mooncake_conv_req_30s", 0), ("synthetic_trend", 0), ("synthetic_seasonal", 0),
        ("azure_conv_req_10s", 300), ("servegen_mlarge_600s", 420),
    ]
    for name, warmup in runs:
        values = series[name][2]
        for log1p in (False, True):
            forecasts, info = arima_predictor(values, log1p, warmup)
            out["arima_predictor"].append({
                "series": name, "warmup": warmup, "log1p": log1p,
                "forecasts": forecasts, "info": info,
            })
            print(f"arima predictor {name} log1p={log1p}: {info.get('order')}", file=sys.stderr)

    # 3. Kalman, every series, both modes.
    for name, (_, _, values) in series.items():
        for log1p in (False, True):
            out["kalman_predictor"].append({
                "series": name, "log1p": log1p, "q_level": 1.0, "q_trend": 0.1, "r": 10.0,
                "forecasts": kalman_predictor(values, log1p),
            })

    # 4. Prophet on 50-point windows ending at a few cut points.
    for name in ("azure_conv_req_60s", "mooncake_conv_req_30s", "synthetic_trend",
                 "synthetic_seasonal", "servegen_mlarge_600s", "azure_code_req_60s"):
        interval, _, values = series[name]
        y = clean(values)
        for end in (20, 50, 57, 100, 480):
            if end > len(y):
                continue
            for log1p in (False, True):
                window = y[max(0, end - 50):end]
                yhat = prophet_fit(window, interval, log1p)
                out["prophet_fits"].append({
                    "series": name, "end": end, "window": 50, "log1p": log1p,
                    "interval_seconds": interval, "yhat": yhat,
                })
                print(f"prophet {name} end={end} log1p={log1p}: {yhat:.4f}", file=sys.stderr)

    with open(OUT, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()

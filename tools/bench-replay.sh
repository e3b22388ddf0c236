#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# `make bench-replay`: the bench's runs in NVIDIA Dynamo's offline replay (its mocker engines,
# router and planner, pinned in tools/dynamo/) instead of this project's simulator.
#
#  1. `planner-sim replay-traces`: the bench's requests (k=1 and k=4) as the replay's Mooncake
#     JSONL, the profile as the mocker's timing tables, and a manifest (targets, the replicas
#     every autoscaled policy starts with, the fixed pool);
#  2. tools/replay/bench_replay.py: each run replayed with each policy (ours through
#     `planner-sim bridge`, also held to Dynamo's default mode's mean GPUs; Dynamo's planner in
#     the modes that run here; a fixed pool);
#  3. `planner-sim replay-report`: the scorecard, in `make bench`'s format.
#
# Settings (environment): REPLAY_SUITE (default bench/suite.json), REPLAY_RATE_SCALES ("1 4"),
# REPLAY_MAX_S (keep only the first seconds of each trace; the whole trace by default),
# REPLAY_STARTUP_S (scale-up delay of new workers, 60), REPLAY_ROUTER (Dynamo's router:
# kv_router, its KV- and load-aware router, or round_robin), REPLAY_POLICIES (all by default),
# REPLAY_DIR (work directory, target/bench-replay), REPLAY_REPORT (bench/replay.md),
# REPLAY_COMMAND (the command named in the report's header), REPLAY_EXPECT_SCALING (policies
# that must change the replicas in every run, else the report fails), REPLAY_CARGO_PROFILE
# (release; `dev` reuses the debug build), REPLAY_BRIDGE_LOG (a directory for the bridge's log of
# every check, per run and policy).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/env.sh

suite="${REPLAY_SUITE:-bench/suite.json}"
read -r -a scales <<<"${REPLAY_RATE_SCALES:-1 4}"
startup="${REPLAY_STARTUP_S:-60}"
dir="${REPLAY_DIR:-target/bench-replay}"
report="${REPLAY_REPORT:-bench/replay.md}"
command="${REPLAY_COMMAND:-make bench-replay}"
profile=h100-llama3.3-70b-tp4

bash tools/dynamo-venv.sh
python="$(dynamo_python)"
# The harness's own arithmetic first (gauges, GPU budget, Dynamo's configurations): a second.
(cd tools/replay && "$python" -m unittest --quiet test_bench_replay)
# The release build by default; CI's short replay uses the debug build `make test` leaves.
cargo_profile="${REPLAY_CARGO_PROFILE:-release}"
log "building planner-sim ($cargo_profile) ..."
"${CARGO:-cargo}" build --profile "$cargo_profile" --locked -p planner-sim
sim="$(pwd)/target/$([[ "$cargo_profile" == dev ]] && echo debug || echo "$cargo_profile")/planner-sim"

rm -rf "$dir"
trace_args=(--suite "$suite" --profile "$profile" --out "$dir")
for k in "${scales[@]}"; do
  trace_args+=(--rate-scale "$k")
done
if [[ -n "${REPLAY_MAX_S:-}" ]]; then
  trace_args+=(--max-duration-s "$REPLAY_MAX_S")
fi
"$sim" replay-traces "${trace_args[@]}"

replay_args=(--manifest "$dir/manifest.json" --bridge "$sim" --startup-s "$startup" --router "${REPLAY_ROUTER:-kv_router}")
for policy in ${REPLAY_POLICIES:-}; do
  replay_args+=(--policy "$policy")
done
if [[ -n "${REPLAY_BRIDGE_LOG:-}" ]]; then
  replay_args+=(--bridge-log "$REPLAY_BRIDGE_LOG")
fi
start=$SECONDS
"$python" tools/replay/bench_replay.py "${replay_args[@]}"
log "replays took $((SECONDS - start)) s"

report_args=(--manifest "$dir/manifest.json" --out "$report" --intervals-csv "$dir/intervals.csv" --command "$command")
for policy in ${REPLAY_EXPECT_SCALING:-}; do
  report_args+=(--expect-scaling "$policy")
done
"$sim" replay-report "${report_args[@]}"

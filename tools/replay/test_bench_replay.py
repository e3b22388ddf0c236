"""Tests of the replay harness's own arithmetic (`make bench-replay` runs them first).

Run with the python of `make dynamo`'s virtual environment:
`python -m unittest discover -s tools/replay -p 'test_*.py'`.
"""

import json
import unittest

import bench_replay


def worker(worker_id, running, waiting, usage=0.0):
    return {
        "worker_id": worker_id,
        "running_requests": running,
        "waiting_requests": waiting,
        "active_cache_usage": usage,
    }


class TelemetryGauges(unittest.TestCase):
    def test_queued_counts_requests_waiting_for_or_in_prefill_only(self):
        # The operator reads the frontend's prefill stages: a request past prefill, waiting for
        # a decode worker, is in flight but not queued.
        policy = bench_replay.BridgePolicy.__new__(bench_replay.BridgePolicy)
        policy.busy = []
        policy.telemetry(
            {
                "active_prefill_ids": [1, 2],
                "active_decode_ids": [3],
                # Worker 9 has been removed: not counted.
                "prefill_scheduler_metrics": [worker(1, 1, 2), worker(2, 0, 0), worker(9, 5, 5)],
                "decode_scheduler_metrics": [worker(3, 5, 3, usage=0.4), worker(9, 7, 7, usage=1.0)],
                "router_pending_prefill_requests": 1,
                "router_pending_decode_requests": 2,
            }
        )
        self.assertEqual(policy.gauges["queued"], 4.0)
        self.assertEqual(policy.gauges["inflight"], 4.0 + 3.0 + 2.0 + 5.0)
        self.assertAlmostEqual(policy.gauges["decode_kv_usage"], 0.4)
        self.assertEqual(policy.busy, [0.5])


class CappedBudget(unittest.TestCase):
    manifest = {"interval_s": 60.0, "gpus": [4, 4]}
    run_ = {"intervals": 2}

    def test_mean_gpus_bill_starting_and_draining_workers_over_the_run(self):
        result = {
            "timeline": [
                [0.0, 0, 1, 0, 0],
                [0.0, 1, 1, 0, 0],
                # A prefill worker asked for at 30 s serves at 90 s; one drains 100-110 s.
                [30.0, 0, 1, 1, 0],
                [90.0, 0, 2, 0, 0],
                [100.0, 0, 1, 0, 1],
                [110.0, 0, 1, 0, 0],
                # Past the run's end: not billed.
                [130.0, 1, 9, 0, 0],
            ]
        }
        prefill = 4 * (30 * 1 + 80 * 2 + 10 * 1)
        decode = 4 * 120 * 1
        self.assertAlmostEqual(
            bench_replay.mean_gpus(result, self.manifest, self.run_), (prefill + decode) / 120.0
        )


class GpuHourBudgetPacing(unittest.TestCase):
    def test_savings_buy_a_burst_and_the_run_stays_within_its_gpu_hours(self):
        # Dynamo's mean of 9 GPUs over an hour, less the drain reserve: 3600 GPU-seconds beyond
        # one 4-GPU engine per pool. The budget starts at 8 + 3 engines (3600 / 300 s / 4).
        budget = bench_replay.GpuHourBudget(9 * 3600.0 / 0.98, 3600.0, [4, 4])
        self.assertEqual(budget.update(0.0, [1, 1]), 8 + 12)
        # The policy holds 1P/1D for 30 minutes: nothing spent beyond the minimum.
        self.assertEqual(budget.update(1800.0, [1, 1]), 8 + 12)
        # Then a burst at 4P/1D: each second bills 12 GPUs more than the minimum; the budget
        # stays while the slack covers them and drops to the minimum once it does not.
        held, used_above = [1, 1], 0.0
        t, budgets = 1800.0, []
        while t < 3600.0:
            b = budget.update(t, held)
            budgets.append(b)
            # The planner follows the budget a minute late (its next interval check).
            if int(t) % 60 == 0:
                held = [max(1, min(4, (b - 4) // 4)), 1]
            used_above += (sum(h * 4 for h in held) - 8) * 1.0
            t += 1.0
        self.assertEqual(max(budgets), 20)
        self.assertEqual(budgets[-1], 8)
        self.assertLessEqual(used_above, 3600.0)
        self.assertGreater(used_above, 3600.0 * 0.5)

    def test_a_policy_already_over_its_gpu_hours_gets_the_minimum(self):
        budget = bench_replay.GpuHourBudget(8 * 3600.0, 3600.0, [4, 4])
        budget.update(0.0, [3, 1])
        self.assertEqual(budget.update(60.0, [3, 1]), 8)


class OracleScheduleTargets(unittest.TestCase):
    def test_each_interval_is_asked_a_start_up_delay_ahead_and_released_at_its_end(self):
        policy = bench_replay.OracleSchedule([[1, 1], [1, 1], [3, 2], [1, 1]], 60.0, 60.0, 1e9)
        self.assertEqual(policy.target(30.0), [1, 1])
        # Interval 2 needs 3P/2D: asked from 60 s, serving by 120 s.
        self.assertEqual(policy.target(60.0), [3, 2])
        self.assertEqual(policy.target(150.0), [3, 2])
        # Released when interval 2 ends; past the schedule, its last interval holds.
        self.assertEqual(policy.target(180.0), [1, 1])
        self.assertEqual(policy.target(9000.0), [1, 1])
        answer = policy.on_tick({"now_ms": 61_000.0})
        self.assertEqual((answer["target_prefill"], answer["target_decode"]), (3, 2))
        self.assertEqual(answer["next_tick_ms"], 62_000.0)


class DynamoConfig(unittest.TestCase):
    manifest = {"gpus": [4, 4]}
    run_ = {
        "ttft_ms": 500.0,
        "itl_ms": 50.0,
        "dynamo_load": {
            "prefill_scale_up_queue_tokens": 4000,
            "prefill_scale_down_queue_tokens": 400,
            "decode_scale_up_kv_rate": 80.0,
            "decode_scale_down_kv_rate": 40.0,
        },
    }

    def test_every_mode_is_a_valid_dynamo_planner_config(self):
        from dynamo.planner.config.planner_config import PlannerConfig

        for mode in bench_replay.DYNAMO_MODES.values():
            config = PlannerConfig.from_config_arg(
                json.dumps(bench_replay.dynamo_planner_config(self.manifest, self.run_, mode))
            )
            self.assertEqual(config.optimization_target, mode)
            self.assertEqual(config.max_gpu_budget, 512)
        load = PlannerConfig.from_config_arg(
            json.dumps(bench_replay.dynamo_planner_config(self.manifest, self.run_, "load"))
        )
        self.assertEqual(load.prefill_scale_up_queue_tokens, 4000)
        self.assertEqual(load.decode_scale_down_kv_rate, 40.0)


if __name__ == "__main__":
    unittest.main()

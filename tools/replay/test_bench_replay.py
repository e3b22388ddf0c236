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

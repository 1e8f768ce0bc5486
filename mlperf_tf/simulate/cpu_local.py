"""Provides the measurements behind the `cpu-local` system: all-reduce α/β, CPU peak, step times.

`python -m mlperf_tf.simulate.cpu_local` (a few minutes on a loaded 2-core machine):

1. α and β of the CPU all-reduce: for each device count, a child process splits the CPU into that
   many logical devices, times `MirroredStrategy`'s cross-replica sum of 4 KB .. 16 MB per
   replica, and fits the ring model t = 2(p-1)·α + 2(p-1)/p · bytes · β by least squares.
   (The gradient-summation issue's `tools/costs/bench_allreduce.py` was not on main when this was
   written; this script measures the same quantities for the simulator.)
2. The CPU's fp32 matmul peak (FLOP/s), the `peak_flops` of `cpu-local`.
3. A benchmark's `smoke` step times through `mlperf-tf run` on 1 device at global batches 16 and
   256 (the calibration: compute efficiency and per-step overhead) and on N devices at 16 (the
   test), in interleaved rounds, keeping each case's fastest round (load from other processes only
   adds time); the simulator's prediction for N devices is printed beside the measurement.
   `--benchmark` picks it; by default the one the committed `cpu-local.json` was calibrated on
   (ResNet-50).

`--write` stores α, β, the peak and the calibrated constants in `systems/cpu-local.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SYSTEM_FILE = os.path.join(os.path.dirname(__file__), "systems", "cpu-local.json")
_SIZES = (1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22)  # floats per replica: 4 KB .. 16 MB


def fit_alpha_beta(p: int, nbytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares α (s) and β (s/byte) of the ring all-reduce model on `p` participants.

    t = a + b·n with a = 2(p-1)·α and b = 2(p-1)/p · β; negative fits are clipped to 0.
    """
    if p < 2:
        raise ValueError(f"an all-reduce needs p >= 2 participants, got {p}")
    if len(nbytes) != len(seconds) or len(nbytes) < 2:
        raise ValueError("need at least two (bytes, seconds) measurements of equal count")
    mean_n, mean_t = statistics.fmean(nbytes), statistics.fmean(seconds)
    var = sum((n - mean_n) ** 2 for n in nbytes)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in zip(nbytes, seconds)) / var
    intercept = mean_t - slope * mean_n
    alpha = max(intercept, 0.0) / (2 * (p - 1))
    beta = max(slope, 0.0) / (2 * (p - 1) / p)
    return alpha, beta


def _child_allreduce(devices: int, repeats: int) -> None:
    """In a fresh process: time the cross-replica sum on `devices` logical CPU devices."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * devices
    )
    strategy = tf.distribute.MirroredStrategy([f"CPU:{i}" for i in range(devices)])
    out = {}
    for size in _SIZES:
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx, size=size: tf.fill(
                [size], tf.cast(ctx.replica_id_in_sync_group, tf.float32)
            )
        )

        @tf.function
        def reduce(v):
            return strategy.run(
                lambda x: tf.distribute.get_replica_context().all_reduce("sum", x), args=(v,)
            )

        reduce(values)  # trace and warm up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = reduce(values)
            strategy.experimental_local_results(result)[0].numpy()
            times.append(time.perf_counter() - start)
        out[size * 4] = statistics.median(times)
    print(json.dumps(out))


def measure_allreduce(devices: int, repeats: int = 15) -> dict[float, float]:
    """Median seconds per all-reduce, by bytes per replica, on `devices` logical CPU devices."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlperf_tf.simulate.cpu_local",
            "--_child",
            str(devices),
            "--repeats",
            str(repeats),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if proc.returncode:
        raise RuntimeError(f"all-reduce child failed: {proc.stderr.strip().splitlines()[-1:]}")
    return {float(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def measure_matmul_peak(size: int = 1024, repeats: int = 10) -> float:
    """FLOP/s of fp32 [size, size] matmuls on this CPU (best of `repeats`)."""
    import tensorflow as tf

    a = tf.random.normal([size, size])
    b = tf.random.normal([size, size])
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


_RATE = re.compile(r"\| ([0-9.]+) samples/s \|")


def measure_step_time(
    benchmark: str, devices: int, batch: int, steps: int = 60, loop: int = 10
) -> float:
    """Seconds per step of `mlperf-tf run --benchmark=BENCHMARK --preset=smoke`, from the
    runner's samples/s of every host loop but the first (which traces)."""
    with tempfile.TemporaryDirectory() as model_dir:
        cmd = [
            sys.executable, "-m", "mlperf_tf.cli", "run", f"--benchmark={benchmark}",
            "--preset=smoke", f"--model_dir={model_dir}", f"--num_cpu_devices={devices}",
            f"--max_train_steps={steps}", f"--steps_per_loop={loop}",
            "--checkpoint_every_loops=0", f"--config.global_batch_size={batch}",
            "--config.max_epochs=1000",
        ]  # fmt: skip
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    rates = [float(m) for m in _RATE.findall(proc.stdout + proc.stderr)]
    if len(rates) < 2:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise RuntimeError(f"no throughput lines from `mlperf-tf run` ({tail})")
    return batch / statistics.median(rates[1:])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlperf_tf.simulate.cpu_local")
    parser.add_argument("--_child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--devices", type=int, default=4, help="the tested device count")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of step timings")
    parser.add_argument("--write", action="store_true", help="update systems/cpu-local.json")
    parser.add_argument(
        "--benchmark",
        required=True,
        help="the benchmark whose smoke preset is timed (docs/scaling.md names the one the "
        "committed cpu-local.json was measured on; a system file names no benchmark)",
    )
    args = parser.parse_args(argv)
    if args._child:
        _child_allreduce(args._child, args.repeats)
        return 0

    from mlperf_tf.simulate import model, systems

    benchmark = args.benchmark
    print(f"load average at start: {os.getloadavg()}")
    fits = {}
    for p in (2, args.devices):
        times = measure_allreduce(p, args.repeats)
        alpha, beta = fit_alpha_beta(p, list(times), list(times.values()))
        fits[p] = {"alpha_s": alpha, "beta_s_per_byte": beta, "seconds_by_bytes": times}
        print(f"all-reduce on {p} devices: alpha {alpha * 1e6:.1f} us, "
              f"beta {beta * 1e9:.3f} ns/byte ({1 / beta / 1e9 if beta else float('inf'):.2f} GB/s)")  # fmt: skip
    peak = measure_matmul_peak()
    print(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s")

    # Interleaved rounds: 1 device at batch 16 and 256 (calibration), N devices at 16 (test).
    cases = [(1, 16), (1, 256), (args.devices, 16)]
    samples = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case in cases:
            samples[case].append(measure_step_time(benchmark, *case))
    # The fastest round: on a shared, loaded machine the other helpers' work only ever adds time.
    steps = {case: min(v) for case, v in samples.items()}
    for case, values in samples.items():
        print(f"step time, {case[0]} device(s), batch {case[1]}: "
              + ", ".join(f"{v * 1e3:.1f}" for v in values) + " ms")  # fmt: skip

    # Two 1-device points fix the two constants: t = batch * flops / (peak * eff) + overhead.
    flops = model.benchmark_facts(benchmark, "smoke")["training_flops_per_sample"]
    (b1, t1), (b2, t2) = (16, steps[(1, 16)]), (256, steps[(1, 256)])
    per_sample = (t2 - t1) / (b2 - b1)
    if per_sample <= 0:
        raise RuntimeError(
            f"batch {b2} ran no slower than batch {b1} ({t2 * 1e3:.1f} vs {t1 * 1e3:.1f} ms): "
            "the machine is too loaded to calibrate; run again with more --rounds"
        )
    efficiency = flops / (per_sample * peak)
    overhead = max(t1 - b1 * per_sample, 0.0)
    link = fits[args.devices]
    data = systems_json(
        peak, efficiency, overhead, link["alpha_s"], link["beta_s_per_byte"], benchmark
    )
    system = systems.from_dict(data, "measured")
    predicted = model.simulate(
        benchmark=benchmark, system=system, chips=args.devices, global_batch=16, preset="smoke"
    )
    measured = steps[(args.devices, 16)]
    print(f"cpu-local: efficiency {efficiency:.3f}, step overhead {overhead * 1e3:.1f} ms")
    print(f"{args.devices} devices, batch 16: predicted {predicted.step_time_s * 1e3:.1f} ms "
          f"(compute {predicted.compute_s * 1e3:.1f}, all-reduce {predicted.allreduce_s * 1e3:.2f}), "
          f"measured {measured * 1e3:.1f} ms: error {predicted.step_time_s / measured - 1:+.1%}")  # fmt: skip
    print(f"load average at end: {os.getloadavg()}")
    if args.write:
        data["measured"] = {
            "allreduce": {
                str(p): {k: v for k, v in f.items() if k != "seconds_by_bytes"}
                for p, f in fits.items()
            },  # fmt: skip
            "step_time_s": {f"{d}dev_batch{b}": v for (d, b), v in samples.items()},
            "prediction_s": predicted.step_time_s,
            "load_average": os.getloadavg(),
        }
        with open(SYSTEM_FILE, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    return 0


def systems_json(peak, efficiency, overhead, alpha, beta, benchmark) -> dict:
    """The cpu-local system file's content from the constants measured on `benchmark` (whose
    name the file does not keep: a system file names no benchmark)."""
    del benchmark
    return {
        "name": "cpu-local",
        "description": "logical CPU devices of one process (--num_cpu_devices), sharing the cores",
        "peak_flops": peak,
        "memory_bandwidth": 10e9,
        "family": "cpu",
        "native_format": "fp32",
        "compute_efficiency": {"default": efficiency},
        "topology": {"kind": "local", "max_chips": 64},
        "link": {"bandwidth": 1.0 / beta if beta else 1e12, "alpha": alpha},
        "chips_per_host": 64,
        "gradient_bytes": 4,
        "optimizer_bytes_per_parameter": 32,
        "overlap_fraction": 0.0,
        "step_overhead_s": overhead,
        "eval_overhead_s": 0.0,
        "shared_compute": True,
        "per_chip_batch": {"default": 4},
        "sources": {
            "all": "measured on this machine by `python -m mlperf_tf.simulate.cpu_local --write` "
            "(see `measured` and docs/scaling.md); memory_bandwidth 10 GB/s assumed",
        },
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Summarise a test log written with ``WORKBENCH_TEST_LOG=FILE`` (tests/conftest.py): the slowest tests,
the failures with the end of their message, and the total, so a GPU suite cut off by a time limit still
says where its time went. Where the log has them (tests/conftest.py writes them on a GPU under xdist):
the time tests waited for the GPU and held it alone, and each worker's busy time and last finish, so the
worker that set the wall time is named with its slowest tests.

    python3 scripts/test_durations.py FILE [--top N]"""
import argparse
import json
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="the file WORKBENCH_TEST_LOG named")
    parser.add_argument("--top", type=int, default=40, help="how many of the slowest tests to list")
    args = parser.parse_args()
    lines = [json.loads(line) for line in open(args.log) if line.strip()]
    outcomes = Counter(line["outcome"] for line in lines if line["when"] == "call" or line["outcome"] != "passed")
    total = sum(line["seconds"] for line in lines)
    print(f"{len(lines)} reports, {total:.0f} s of test time in all: " + ", ".join(f"{n} {o}" for o, n in outcomes.items()))
    print(f"\nslowest {args.top}:")
    for line in sorted(lines, key=lambda line: -line["seconds"])[: args.top]:
        print(f"  {line['seconds']:8.1f} s  {line['outcome']:7}  {line['test']}")
    if any("gpu_alone_s" in line for line in lines):
        waited = sum(line.get("gpu_wait_s", 0) for line in lines)
        alone = sum(line.get("gpu_alone_s", 0) for line in lines)
        print(f"\nGPU lock: {waited:.0f} s waited in all; {alone:.0f} s held alone (measurements, run one at a time)")
        loaded, compiled = (sum(line.get(f"kernels_{k}", 0) for line in lines) for k in ("loaded", "compiled"))
        print(f"kernels: {compiled} compiled, {loaded} read from the workers' shared cache")
    timed = [line for line in lines if line.get("worker") and line.get("start")]
    if timed:
        t0 = min(line["start"] for line in timed)
        workers = {}
        for line in timed:
            busy, end, tests = workers.get(line["worker"], (0.0, 0.0, []))
            workers[line["worker"]] = (busy + line["seconds"], max(end, line["start"] + line["seconds"] - t0),
                                       tests + [line])
        print("\nworkers (busy s, last finish s after the first start):")
        for worker, (busy, end, tests) in sorted(workers.items(), key=lambda w: -w[1][1]):
            print(f"  {worker:6} {busy:7.0f} {end:7.0f}")
        last = max(workers.values(), key=lambda w: w[1])
        print("the last worker's slowest tests: " + "; ".join(
            f"{line['test'].split('::')[-1]} {line['seconds']:.0f} s" for line in sorted(last[2], key=lambda l: -l["seconds"])[:8]))
    failed = [line for line in lines if line["outcome"] == "failed"]
    if failed:
        print(f"\n{len(failed)} failed:")
        for line in failed:
            print(f"- {line['test']} ({line['when']})\n  " + line.get("error", "").strip().splitlines()[-1][:300])


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... | head` ends the listing quietly, not with a traceback
    main()

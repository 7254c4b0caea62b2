"""Summarise a test log written with ``WORKBENCH_TEST_LOG=FILE`` (tests/conftest.py): the slowest tests,
the failures with the end of their message, and the total, so a GPU suite cut off by a time limit still
says where its time went.

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
    failed = [line for line in lines if line["outcome"] == "failed"]
    if failed:
        print(f"\n{len(failed)} failed:")
        for line in failed:
            print(f"- {line['test']} ({line['when']})\n  " + line.get("error", "").strip().splitlines()[-1][:300])


if __name__ == "__main__":
    main()

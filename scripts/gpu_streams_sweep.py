"""The overlapped streams stage (solutions/streams.py) at other chunk and stream counts: its share of the
link's both-ways ceiling, and how long the host took to issue the work (if the host issues more slowly
than the copy engines move the chunks, the engines wait for it).

    python3 scripts/gpu_streams_sweep.py [N]

Prints one JSON line per (chunks, streams): the best of five runs, the host's issue time, and the last
run's relative error against the float64 reference."""
import json
import sys
import time

import numpy as np


def main() -> None:
    from solutions import streams

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 26
    link = streams.measure_link(n)
    print(json.dumps({"link": link}), flush=True)
    overlapped = next(s for s in streams.STAGES if s.name == "overlapped")
    x, out = streams.host_arrays(n, pinned=True)
    ref = streams.reference(x)
    cuda = streams.cuda
    for n_streams in (2, 4, 8):
        streams.STREAMS = n_streams
        ws = streams.Workspace(n)
        for chunks in (8, 16, 32, 64):
            streams.CHUNKS = chunks
            totals, issues = [], []
            for _ in range(5):
                out[:] = np.nan
                cuda.synchronize()
                tl = streams.Timeline()
                tl.begin()
                started = time.perf_counter()
                overlapped.run(x, out, ws, tl)
                issues.append((time.perf_counter() - started) * 1e3)
                end = cuda.event()
                end.record()
                end.synchronize()
                totals.append(tl.origin.elapsed_time(end))
            err = float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))
            best = min(totals)
            print(json.dumps({"streams": n_streams, "chunks": chunks, "best_ms": best,
                              "percent_of_link": 100.0 * link["both_ways_ms"] / best, "issue_ms_median":
                              float(np.median(issues)), "rel_err": err}), flush=True)


if __name__ == "__main__":
    main()

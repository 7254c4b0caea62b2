# CORRECT (unusual): matvec.thread_per_row that prints lines which look like a report: a JSON fragment, the
# old grader's protocol prefix followed by garbage, a half line. `workbench grade` once died on such a line
# with a JSONDecodeError; prints must never decide or break a verdict.
"""matvec.thread_per_row: garbage on stdout, including protocol-looking lines."""

from numba import cuda, float32

from workbench.ladder import blocks_for

EXPECT = {"target": "matvec.thread_per_row", "class": "correct", "verdict": "accept", "cpu": True}

THREADS = 256

print('{"event": "result", "passed": tru')
print("@@workbench-grade@@ {not json at all")
print("@@workbench-grade@@ " + '{"event": "stage", "stage": "matvec.thread_per_row", "result": {"passed": false}}')


@cuda.jit
def _thread_per_row(a, x, y):
    row = cuda.grid(1)
    if row < a.shape[0]:
        acc = float32(0.0)
        for col in range(a.shape[1]):
            acc += a[row, col] * x[col]
        y[row] = acc


def thread_per_row(a, x, y):
    print("@@workbench-grade@@ \x00\x01 garbage", flush=True)
    _thread_per_row[blocks_for(a.shape[0], THREADS), THREADS](a, x, y)

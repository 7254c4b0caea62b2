"""Why a case failed, as a short code, and the advice a learner reads for each.

The codes are shared by the report, the JSON and the JUnit output (the failure ``type``). Codes in
:data:`HARNESS` are the grader's own trouble (a bad ``--size``, a bug here): never blamed on the
submission, and never counted as a failed stage.
"""

from __future__ import annotations

ADVICE = {
    "not-implemented": ("not implemented yet: write the code where the TODO(exercise) line is, then delete "
                        "that line"),
    "missing": "the submission does not define this stage",
    "import-error": ("the submission could not be imported: fix the error above (file and line are in the "
                     "traceback)"),
    "answer-key": ("the answer key (solutions/) is not yours to run while grading: write your own kernels "
                   "(the exercise file has everything else you need)"),
    "exec": ("code built at run time (exec, compile) cannot be graded: write your kernels in the file "
             "itself"),
    "out-of-bounds": ("out-of-bounds access: missing bounds check? The grid is rounded up to whole blocks, so "
                      "the last block has threads with no element: guard every access (if i < x.size:)"),
    "gpu-fault": ("the GPU stopped your kernel: check every index against its array's size (the last block "
                  "has threads past the end), and every shared array's index against its declared size; the "
                  "simulator (WORKBENCH_MODE=sim) names the line of an out-of-bounds access"),
    "launch-limit": ("the launch was refused: a block may have at most 1024 threads (x*y*z) and 48 KiB of "
                     "static shared memory; launch more blocks instead"),
    "warp-sync": "a warp intrinsic was called by only part of the lanes in its mask (a shuffle inside a branch?)",
    "race": ("two threads used the same memory, at least one writing, with nothing ordering them: within a "
             "block, put a cuda.syncthreads() between the write and the other thread's read; across blocks "
             "(which run at the same time on a GPU), use cuda.atomic.* for shared counters and totals, or give "
             "each block its own output and combine them in a second kernel"),
    "unwritten": ("some output elements were never written: does every output element get a thread (or a "
                  "loop iteration)? Check the grid size and the loop bounds. (Or the output was accumulated "
                  "into without being zeroed first: it starts as garbage)"),
    "uninitialised": ("the output was accumulated into (atomics, +=) without being set to zero first: device "
                      "memory starts as garbage, zero it in a kernel before accumulating"),
    "nan": ("is there a cuda.syncthreads() between the threads' writes to shared memory and their reads of "
            "each other's data? Is every accumulator and buffer initialised before use (new device memory, "
            "like shared memory, starts as garbage)?"),
    "all-zeros": "the output is all zeros: was the result computed but never stored?",
    "wrong-values": "wrong values: the report shows the first wrong index and the worst elements",
    "shape": "the output has the wrong shape",
    "stale": ("the same size called again with new inputs gave a wrong answer: does the stage keep results "
              "(or buffers it never resets) from an earlier call?"),
    "input-modified": "the stage wrote to an input: inputs are read-only (use a scratch buffer)",
    "no-kernel-launch": ("no kernel was launched: the stage must compute on the GPU, in a @cuda.jit kernel "
                         "(computing with numpy on the host is not the exercise)"),
    "host-copy": ("the stage read device data on the host while running: the computation must stay on the "
                  "GPU (no copy_to_host, numpy or indexing of device arrays in a launcher)"),
    "host-write": ("the stage wrote its output from the host: the output must be written by your kernels "
                   "(zero it in a kernel too)"),
    "process": "a stage computes on the GPU and returns: it may not start processes",
    "background-process": ("a process the stage started was still running after the call: a stage may not "
                            "leave processes behind (they were stopped)"),
    "wrote-file": ("the stage wrote to a file in the repository: grading must leave your files and the "
                   "repository as they were (the write was refused)"),
    "exited": "the stage ended the grading process: a launcher must return, not exit",
    "tampered": ("the submission replaced (monkeypatched) numba's or the grader's own functions, such as a "
                 "device array's copy_to_host: a stage launches kernels, it does not change the tools that "
                 "read its results"),
    "not-done": ("the output was not written when an event recorded after the call on the default stream had "
                 "fired: work left running on another stream or thread is not the call's, and a timer waiting "
                 "on that stream does not count it; launch on the default stream and return when it is queued"),
    "thread": ("a thread the stage started was still running when the call returned: work left to another "
               "thread (or stream) is not done when the call's stream is synchronized, so it would not be "
               "timed; launch every kernel from the call itself, on the default stream"),
    "signal": ("the submission sent a signal to a process it did not start (the grader?): a stage may only "
               "stop what is its own"),
    "channel": ("the grader's channel received data that was not the grader's: a submission must not write "
                "to file descriptors it did not open"),
    "compile-error": "the kernel does not compile for the GPU (the message names the line and the types)",
    "exception": "the stage raised an exception",
    "timeout": ("did not finish in time: a kernel that never ends? (a loop whose index never advances, a "
                "cuda.syncthreads() that some threads never reach, a block waiting on another block)"),
    "crash": ("the process running your code died during this case (a segfault in a kernel or a native "
              "library your code called?)"),
    "below-roofline": ("the time measured is below what the memory allows: work left running on another "
                       "stream or thread when the launcher returned is not done (the timer waits only for the "
                       "default stream), and the clocks and the timer are not the submission's to replace"),
    "too-slow": "correct, but slower than the speed bar: see the stage's lesson for what makes it fast",
    "needs-gpu": "the simulator cannot run this: grade it on a machine with a GPU",
    "grader-error": "an error in the grader itself, not in your code: please report it (the message says where)",
}

# The grader's trouble, not the submission's: reported as errors, never as a failed stage.
HARNESS = {"grader-error"}

SHARED_MEMORY_ADVICE = ("this stage's kernels share data through shared memory: does a cuda.syncthreads() "
                        "separate every write to it from other threads' reads (and is it initialised before "
                        "use)? In the simulator, shared memory starts as garbage: NaN for floats, 0x7FFBADAD "
                        "for ints")


# A race's advice by what the simulator saw, the likely cause first: in shared memory, threads of one block
# (a tree step reading a partner's slot) want a barrier far more often than atomics; a `+=` both threads
# made to one element wants an atomic; blocks racing each other want atomics or a slot per block.
RACE_ADVICE = {
    "shared": ("threads of one block used the same shared-memory element with nothing ordering them: a "
               "cuda.syncthreads() is missing between one thread's write and another's read (after filling "
               "the shared array, and after each step of a tree); every thread of the block must reach it. "
               "Only where threads update one element together (a shared counter) use cuda.atomic.*"),
    "update": ("two threads made a read-modify-write (`+=`) of the same element, which is not atomic: use "
               "cuda.atomic.add (or another cuda.atomic operation) for updates that threads share"),
    "blocks": ("two blocks used the same memory: blocks run at the same time on a GPU, and no barrier orders "
               "them; use cuda.atomic.* for shared totals, or give each block its own slot and combine the "
               "slots in a second kernel launch"),
}


def race_kind(message: str) -> str:
    """Which RACE_ADVICE fits a race the simulator described (its message), "" if none does better."""
    if "(shared memory)" in message:  # first: in shared memory a missing barrier is the likelier cause, even of
        return "shared"  # a `+=` race (which of a tree's races the simulator meets first varies from run to run)
    if "read-modify-write" in message:
        return "update"
    if "blocks of a launch run at the same time" in message:
        return "blocks"
    return ""


def advice_for(reason: str, uses_shared_memory: bool = False, message: str = "") -> str:
    """The advice shown under a failed case: the reason's own (a race's by what raced, from its
    ``message``), plus the shared-memory question where wrong values may come from a missing barrier."""
    if reason == "race" and race_kind(message):
        return RACE_ADVICE[race_kind(message)]
    advice = ADVICE.get(reason, "")
    if uses_shared_memory and reason in ("wrong-values", "unwritten", "all-zeros", "stale"):
        advice = (advice + ". Also: " if advice else "") + SHARED_MEMORY_ADVICE
    return advice

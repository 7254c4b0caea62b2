"""Every size an operator declares (simulator, GPU check, bench, headline), and every size the grader derives
from them, is one its own validation accepts.

pool2d[max] once listed 1x1x1x2 among its GPU check sizes, a plane its 2x2 pool refuses: `workbench check`
on a GPU then failed every stage there. Inputs are built for the small sizes only (the simulator holds them
in host memory); every size also passes the operator's size model (its bytes_moved)."""

import re

import numpy as np
import pytest

from workbench import registry
from workbench.grade.targets import grade_sizes
from workbench.ladder import as_size, to_device

SMALL_BYTES = 4 << 20


def declared(op):
    named = [("sim", s) for s in op.sim_sizes] + [("check", s) for s in op.check_sizes]
    named += [("bench", s) for s in op.bench_sizes] + [("headline", op.headline_size), ("quick", op.quick_sim_size())]
    named += [("grade", s) for s in grade_sizes(op, "sim")]  # the GPU's: test_gpu_grading_sizes_are_accepted
    return [(kind, as_size(s)) for kind, s in named]


@pytest.mark.parametrize("op", list(registry.load_operators().values()), ids=lambda op: op.name)
def test_declared_sizes_are_accepted_by_the_operator(op):
    rng = np.random.default_rng(0)
    for kind, size in declared(op):
        if op.bytes_moved(size) > SMALL_BYTES:  # the size model accepts it (it raises InputError otherwise)
            continue
        inputs = [to_device(a) for a in op.make_inputs(size, rng)]
        op.validate(*inputs, to_device(op.make_output(size)))  # raises InputError naming the problem


def test_a_size_the_operator_refuses_is_one_error_before_anything_runs():
    from workbench import sizes

    ops = registry.load_operators()
    with pytest.raises(sizes.SizeError, match=re.escape("pool2d[max] at 1x1x1x2: a 2x2 max-pool needs planes of at least 2x2")):
        sizes.check_size(ops["pool2d[max]"], (1, 1, 1, 2))
    assert sizes.check_size(ops["pool2d[max]"], (1, 1, 2, 3)) == (1, 1, 2, 3)


def test_a_flag_field_may_be_zero_and_nothing_else_may():
    """attention's CAUSAL is 0 in its own declared sizes: `--size 1x1x17x16x0` is a size, not an error."""
    from workbench.sizes import SizeError, check_size

    op = registry.operator("attention")
    assert check_size(op, (1, 1, 17, 16, 0)) == (1, 1, 17, 16, 0)
    with pytest.raises(SizeError, match="at least 1.*causal at least 0.*seq=0"):
        check_size(op, (1, 1, 0, 16, 0))
    with pytest.raises(SizeError, match="causal=-1"):
        check_size(op, (1, 1, 5, 16, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(registry.load_operators().values()), ids=lambda op: op.name)
def test_gpu_grading_sizes_are_accepted(op):
    """The sizes the grader derives for a GPU (one more in each dimension than the middle and the
    largest check size, where the operator accepts it): decode attention's once had query heads that
    were no multiple of the KV heads, and the answer key read past the cache."""
    from workbench.sizes import accepted_size

    checked = [as_size(s) for s in op.check_sizes]  # test_declared_sizes_are_accepted_by_the_operator's
    for size in [s for s in grade_sizes(op, "gpu") if s not in checked]:
        accepted_size(op, size, build_up_to=1 << 28)  # validated on inputs built at each size

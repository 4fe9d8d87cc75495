"""The project's Lite kernels against numpy (tests/support/lite_kernel_cases.py), run by pytest in a process of
its own: they load Lite's libraries into the test process, which must not have imported mindspore
(both ship libmindspore_core.so), and this suite's process has."""
import os

from support.tiny_models import REPO, run_cli


def test_the_kernels_equal_numpy_on_lite_in_a_process_without_mindspore():
    result = run_cli(["-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(REPO, "tests", "support", "lite_kernel_cases.py")],
                     timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout and "error" not in result.stdout

"""Shared pytest settings.

With TFM_NO_SKIP=1 (set by .ci/run) a skipped test counts as a failure: in CI
every real model and prompt set is installed, so a skip would hide a gap.

Tests marked ``gpu`` need a CUDA build: on a build without a GPU device they are
deselected at collection (reported as deselected, not skipped), since CI never has a GPU.
"""
import os

import pytest


def _no_skip() -> bool:
    return os.environ.get("TFM_NO_SKIP") == "1"


def _skip_reason(longrepr) -> str:
    """The message of a skip report (its longrepr is (path, line, message) or text)."""
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under TFM_NO_SKIP=1 turn a skip (test body, fixture, skip marker) into a failure while the
    report is made, so every reporter (progress, summary, exit status) sees the same outcome."""
    outcome = yield
    report = outcome.get_result()
    if _no_skip() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under TFM_NO_SKIP=1: {_skip_reason(report.longrepr)}"


_collection_skips: list[str] = []


def pytest_collectreport(report):
    """Remember modules skipped while collected (a module-level importorskip or skip)."""
    if _no_skip() and report.skipped:
        _collection_skips.append(f"{report.nodeid}: {_skip_reason(report.longrepr)}")


def pytest_terminal_summary(terminalreporter):
    for line in _collection_skips:
        terminalreporter.write_line(f"FAILED (skipped module under TFM_NO_SKIP=1) {line}", red=True)


def pytest_sessionfinish(session):
    """A module skipped at collection fails the run under TFM_NO_SKIP=1 (its tests never ran)."""
    if _collection_skips and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_collection_modifyitems(config, items):
    """Deselect the ``gpu``-marked tests when this build has no GPU device."""
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from tfm_local.testing import gdn_ops as tree_ops

    if "gpu" in tree_ops.available_devices():
        return
    config.hook.pytest_deselected(items=gpu_items)
    items[:] = [it for it in items if not it.get_closest_marker("gpu")]


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target, drafter) GGUF paths: a tiny random qwen2 target (3 layers) and a random DFlash drafter for it.

    Shared by the tests that run the command-line tools and the server as processes.
    """
    from tfm_local.testing.synth import write_tiny_target
    from tfm_convert.pipeline import init_random

    d = tmp_path_factory.mktemp("tiny_pair")
    target = write_tiny_target(d / "target.gguf", n_layer=3)
    drafter, _ = init_random(target, d / "drafter.gguf", seed=4)
    return target, drafter


@pytest.fixture
def one_torch_thread():
    """Tiny models: one torch thread is fastest on a shared 2-core machine (restored after the test)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

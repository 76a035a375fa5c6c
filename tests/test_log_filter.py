"""kfp.local's output without the executor-input dumps, and nothing else lost."""

from __future__ import annotations

import io

from pipelines.log_filter import ExecutorInputFilter

DEMO_LOG = """\
    [KFP Executor 2026-11-22 15:13:28,226 INFO]: Looking for component `plan_shards`
    [KFP Executor 2026-11-22 15:13:28,226 INFO]: Got executor_input:
    {
        "inputs": {
            "parameterValues": {
                "spec_json": "{}"
            },
            "artifacts": [
            ]
        }
    }
    experiment smoke: minutes on a CPU
            [KFP Executor 2026-11-22 15:13:35,390 INFO]: Got executor_input:
            {
                "outputs": {}
            }
            Traceback (most recent call last):
            ValueError: boom
"""


def test_the_filter_drops_only_the_executor_input_json() -> None:
    out = io.StringIO()
    stream = ExecutorInputFilter(out)
    for piece in (DEMO_LOG[:100], DEMO_LOG[100:333], DEMO_LOG[333:]):  # arbitrary write boundaries
        stream.write(piece)
    lines = out.getvalue().splitlines()
    assert lines == [
        "    [KFP Executor 2026-11-22 15:13:28,226 INFO]: Looking for component `plan_shards`",
        "    experiment smoke: minutes on a CPU",
        "            Traceback (most recent call last):",
        "            ValueError: boom",
    ]


def test_a_header_without_json_after_it_swallows_nothing_else() -> None:
    out = io.StringIO()
    ExecutorInputFilter(out).write("x Got executor_input:\nRuntimeError: the next line is kept\nand this one\n")
    assert out.getvalue() == "RuntimeError: the next line is kept\nand this one\n"

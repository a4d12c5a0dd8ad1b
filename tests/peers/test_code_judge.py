"""The sandbox comparison through code-judge's API: the client and report against this project's
service; code-judge itself when a checkout is named (RSTAR_CODE_JUDGE) and Redis is installed."""

import os
import shutil

import pytest

from rstar.bench.peers import code_judge


def test_the_code_judge_api_client_measures_this_projects_service():
    results = code_judge.compare(None, trivial=120, sympy=8, single=10)
    assert [r.system for r in results] == ["rstar sandbox (code-judge API)"]
    ours = results[0]
    assert ours.trivial_per_s > 0 and ours.sympy_per_s > 0 and ours.p50_ms > 0
    lines = code_judge.report(results, None)
    assert any("code-judge: not measured" in line and code_judge.GET_IT in line for line in lines)


def test_a_directory_that_is_not_a_code_judge_checkout_is_named(tmp_path):
    if shutil.which("redis-server") is None:
        with pytest.raises(FileNotFoundError, match="apt-get install redis-server"):
            with code_judge.code_judge(str(tmp_path), 2):
                pass
        return
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} is not a code-judge checkout"):
        with code_judge.code_judge(str(tmp_path), 2):
            pass


@pytest.mark.skipif(
    not os.environ.get("RSTAR_CODE_JUDGE") or shutil.which("redis-server") is None,
    reason="needs a code-judge checkout (RSTAR_CODE_JUDGE) and redis-server",
)
def test_code_judge_runs_the_same_calls():
    results = code_judge.compare(os.environ["RSTAR_CODE_JUDGE"], trivial=100, sympy=4, single=5)
    assert results[1].system.startswith("code-judge") and results[1].trivial_per_s > 0

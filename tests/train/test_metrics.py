"""One namespace for both trainers' step metrics (rstar.train.metrics)."""

from rstar.train.metrics import namespaced


def test_a_local_step_is_logged_under_the_namespaces_verls_steps_use():
    step = {
        "step": 3,
        "accuracy": 0.5,
        "response_len_mean": 120.0,
        "sandbox_failure_rate": 0.0,
        "kept": 16,
        "tool_error_rate_positive": 0.1,
        "tool_errors_positive_kept": 2,
        "loss": 0.01,
        "grad_norm": 1.5,
        "lr": 1e-6,
        "time_update_s": 20.0,
        "finish_reasons": {"answered": 3},  # not a number: not logged
    }
    assert namespaced(step) == {
        "rollout/accuracy": 0.5,
        "rollout/response_len_mean": 120.0,
        "rollout/sandbox_failure_rate": 0.0,
        "roc/kept": 16,
        "roc/tool_error_rate_positive": 0.1,
        "roc/tool_errors_positive_kept": 2,
        "losses/loss": 0.01,
        "losses/grad_norm": 1.5,
        "charts/lr": 1e-6,
        "charts/time_update_s": 20.0,
    }

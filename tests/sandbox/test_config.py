import pytest

from rstar.sandbox.config import SandboxConfig


def test_shipped_yaml_loads_and_matches_defaults():
    cfg = SandboxConfig.from_yaml("configs/sandbox.yaml")
    defaults = SandboxConfig()
    for key in ("timeout_s", "memory_mb", "slots_per_executor", "batch_size", "uid_base"):
        assert getattr(cfg, key) == getattr(defaults, key)


@pytest.mark.parametrize(
    "text,message",
    [
        ("timeout_s: soon\n", "timeout_s must be float"),
        ("memroy_mb: 10\n", "unknown sandbox config keys: ['memroy_mb']"),
        ("- a list\n", "expected a mapping"),
        ("cpu_time_s: -1\n", "cpu_time_s must be >= 0"),
        ("isolation: maybe\n", "isolation must be 'strict' or 'auto'"),
    ],
)
def test_bad_yaml_names_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "sb.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        SandboxConfig.from_yaml(str(path))
    assert str(path) in str(err.value) and message in str(err.value)


def test_public_api_names_resolve():
    import rstar.sandbox as sandbox

    for name in sandbox.__all__:
        assert getattr(sandbox, name).__name__ == name

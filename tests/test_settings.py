"""``nas.settings``: every NAS_* variable parsed in one place, documented in docs/cli.md, and no
other module reading the environment for them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nas import settings
from nas.settings import VARIABLES, Settings, SettingsError

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_and_parsing():
    assert Settings.from_env({}) == Settings()
    s = Settings.from_env(
        {
            "NAS_STORAGE": "x.journal",
            "NAS_HEARTBEAT_SECONDS": "2",
            "NAS_TRAIN_COMPILE": "1",
            "NAS_OPTIM_FUSED": "0",
            "NAS_LINEAR_TMA": "0",
            "NAS_FAULT": " oom@1 ",
        }
    )
    assert (s.storage, s.heartbeat_seconds, s.train_compile, s.optim_fused, s.linear_tma, s.fault) == (
        "x.journal",
        2,
        True,
        False,
        False,
        "oom@1",
    )
    assert Settings.from_env({"NAS_OPTIM_FUSED": "1", "NAS_LINEAR_TMA": "1"}).optim_fused is None
    assert Settings.from_env({"NAS_LINEAR_TMA": "1"}).linear_tma is True


@pytest.mark.parametrize(
    "env",
    [
        {"NAS_HEARTBEAT_SECONDS": "0"},
        {"NAS_HEARTBEAT_SECONDS": "1.5"},
        {"NAS_TRAIN_COMPILE": "yes"},
        {"NAS_LINEAR_TMA": "2"},
    ],
    ids=lambda e: "=".join(*e.items()),
)
def test_bad_values_name_the_variable(env):
    with pytest.raises(SettingsError, match=next(iter(env))):
        Settings.from_env(env)


def test_get_follows_the_environment_and_parses_once(monkeypatch):
    monkeypatch.setenv("NAS_STORAGE", "a.journal")
    first = settings.get()
    assert first.storage == "a.journal" and settings.get() is first  # not parsed again
    monkeypatch.setenv("NAS_STORAGE", "b.journal")
    assert settings.get().storage == "b.journal"


def test_every_variable_is_documented_in_the_cli_reference():
    reference = (ROOT / "docs" / "cli.md").read_text()
    missing = [name for name in VARIABLES if f"`{name}`" not in reference]
    assert not missing, f"docs/cli.md lacks {missing}"


# the only other touches of the environment, and why
ALLOWED = {
    "nas/search/workers.py": "copies the environment for the worker processes it starts",
    "nas/search/auto_workers.py": "copies the environment for the probe process it starts",
    "nas/results/report.py": "sets BROWSER_PATH for kaleido's browser driver",
}


def test_no_other_module_reads_the_environment():
    offenders = []
    for package in ("nas", "kernels", "hardware_profiles"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "nas/settings.py" or rel in ALLOWED:
                continue
            offenders += [
                f"{rel}:{n}"
                for n, line in enumerate(path.read_text().splitlines(), 1)
                if re.search(r"os\.(environ|getenv)", line)
            ]
    assert not offenders, offenders

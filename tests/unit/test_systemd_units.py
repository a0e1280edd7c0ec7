"""The systemd units as systemd reads them: `systemd-analyze verify` finds nothing to say
about any of them, and `systemd-analyze security` rates each one's sandbox OK or better
(an exposure under 5.0). Skipped, saying why, where systemd-analyze is not installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
# systemd-analyze's scale: under 5.0 is "OK" (under 2.0 "SAFE"), from 9.0 "UNSAFE".
MAX_EXPOSURE = 5.0
OVERALL = re.compile(r"Overall exposure level for \S+: (?P<exposure>\d+\.\d+) (?P<rating>\w+)")
# The distribution's own units (sysinit.target, network-online.target...) that ours
# are ordered after: verify loads them from the root it checks.
SYSTEM_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))

pytestmark = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd): the units' "
           "syntax and sandbox are not checked here")


def exposure_of(unit: Path) -> tuple[float, str]:
    """The unit's overall exposure and rating, scored offline from its file alone."""
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", str(unit)],
                            capture_output=True, text=True, timeout=60, check=False)
    match = OVERALL.search(result.stdout)
    assert match, result.stdout + result.stderr
    return float(match["exposure"]), match["rating"]


def verify_complaints(units: list[Path], root: Path) -> str:
    """What `systemd-analyze verify` says of ``units`` (empty when nothing), installed in
    ``root`` as the RUNBOOK installs them, beside the distribution's units and a
    stand-in for each program they run."""
    assert SYSTEMD_ANALYZE is not None
    unit_dir = root / "etc" / "systemd" / "system"
    unit_dir.mkdir(parents=True, exist_ok=True)
    system_dir = next(path for path in SYSTEM_UNIT_DIRS if path.is_dir())
    shutil.copytree(system_dir, root / "usr" / "lib" / "systemd" / "system", symlinks=True,
                    dirs_exist_ok=True)
    for unit in units:
        text = unit.read_text(encoding="utf-8")
        (unit_dir / unit.name).write_text(text, encoding="utf-8")
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                program = root / shlex.split(line.partition("=")[2])[0].lstrip("/")
                program.parent.mkdir(parents=True, exist_ok=True)
                program.write_text("#!/bin/sh\n")
                program.chmod(0o755)
    result = subprocess.run([SYSTEMD_ANALYZE, "verify", f"--root={root}",
                             *(unit.name for unit in units)],
                            capture_output=True, text=True, timeout=120, check=False)
    return (result.stdout + result.stderr).strip() or ("" if result.returncode == 0
                                                       else f"exit {result.returncode}")


@pytest.mark.parametrize("unit", UNITS, ids=lambda path: path.name)
def test_each_unit_rates_ok_or_better_in_systemd_analyze_security(unit: Path) -> None:
    exposure, rating = exposure_of(unit)
    assert exposure < MAX_EXPOSURE, (unit.name, exposure, rating)


def test_an_unsandboxed_unit_would_be_rated_exposed(tmp_path: Path) -> None:
    bare = tmp_path / "bare.service"
    bare.write_text("[Service]\nUser=compactor\nExecStart=/opt/session-compactor/bin/compactor "
                    "worker\n")
    exposure, rating = exposure_of(bare)
    assert exposure >= MAX_EXPOSURE and rating in ("EXPOSED", "UNSAFE")


def test_systemd_analyze_verify_finds_nothing_to_say_about_the_units(tmp_path: Path) -> None:
    assert len(UNITS) == 3
    assert verify_complaints(UNITS, tmp_path / "root") == ""


def test_verify_would_catch_a_misspelt_directive(tmp_path: Path) -> None:
    broken = tmp_path / "units" / "compactor-beat.service"
    broken.parent.mkdir()
    broken.write_text((SYSTEMD / broken.name).read_text().replace("ProtectHome=", "ProtectHom="))
    assert "Unknown key 'ProtectHom'" in verify_complaints([broken], tmp_path / "root")

"""Builds this checkout's sdist and wheel as `pip install` builds them (PEP 517, in an isolated
environment), from a copy of the files git knows of: what a user's build would see."""

import shutil
import subprocess
import sys
from pathlib import Path

from django.conf import settings

REPOSITORY = Path(settings.BASE_DIR)
BUILD_TIMEOUT_SECONDS = 600


def _checkout_copy(destination: Path) -> Path:
    """The files git knows of (tracked, or new and not ignored), as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPOSITORY,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPOSITORY / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def build_distributions(*, workspace: Path, output: Path) -> dict[str, Path]:
    """Builds into `output` and returns {"wheel": path, "sdist": path}; `workspace` receives
    the copy of the checkout."""
    source = _checkout_copy(workspace)
    # The sdist first, then the wheel built from it: what `pip install <sdist>` does.
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(output), str(source)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = output.glob("*.whl")
    [sdist] = output.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}

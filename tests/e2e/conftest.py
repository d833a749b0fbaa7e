import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def selfserve():
    exe = os.environ.get("SELFSERVE_BIN", str(ROOT / "build" / "selfserve"))
    if not os.path.exists(exe):
        pytest.fail(f"{exe} not built; run tools/test.sh or set SELFSERVE_BIN")

    def run(*args, input=None, check=True, timeout=600, env=None):
        r = subprocess.run([exe, *args], input=input, capture_output=True, timeout=timeout,
                           env={**os.environ, **env} if env else None)
        if check and r.returncode != 0:
            raise AssertionError(f"selfserve {' '.join(args)} failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
        return r

    return run


@pytest.fixture(scope="session")
def default_model(selfserve):
    return selfserve("fetch").stdout.decode().strip()

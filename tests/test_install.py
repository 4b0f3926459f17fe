"""install.sh installs with uv, from where the user's pip configuration says pip would: a mirror as
the index, an extra index (PyTorch's, for MLRB_TORCH), a wheel folder. uv reads none of pip's
settings, so install.sh hands them over (`uv_options_from_pip`); this installs packages that only
those places hold, with the function as install.sh has it and the uv it installs."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.fast


def wheel(folder: Path, name: str) -> Path:
    """A pure-Python wheel of NAME 1.0, one module that says where it came from, in FOLDER."""
    dist = f"{name}-1.0"
    files = {
        f"{name}/__init__.py": f"FROM = {folder.name!r}\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: mlrb-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name_in_wheel, text in files.items():
            archive.writestr(name_in_wheel, text)
    return path


def simple_index(root: Path, name: str) -> str:
    """A package index (PEP 503, on disk) that holds NAME alone; its file:// address."""
    project = root / name.replace("_", "-")
    built = wheel(project, name)
    (project / "index.html").write_text(f'<html><body><a href="{built.name}">{built.name}</a></body></html>\n')
    return root.as_uri()


def uv_options_from_pip() -> str:
    """install.sh's function, as it has it."""
    found = re.search(r"^uv_options_from_pip\(\) \{\n.*?^\}\n", (REPO / "install.sh").read_text(), re.S | re.M)
    assert found, "install.sh has no uv_options_from_pip function"
    return found.group(0)


def pip_of(which: str, tmp_path: Path) -> str:
    """A Python whose pip is asked: the venv's (install.sh upgrades it) or the one a new venv has."""
    if which == "the venv's pip":
        return sys.executable
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "bundled")], check=True)
    return str(tmp_path / "bundled" / "bin" / "python")


# pip 23 lists its settings sorted by name, newer ones in the order of their precedence: either is read.
@pytest.mark.parametrize("which", ["the venv's pip", "a new venv's pip"])
def test_uv_installs_from_the_index_extra_index_and_wheel_folder_pip_is_configured_with(which, tmp_path):
    import certifi

    certificate = tmp_path / "certificates.pem"  # pip's certificate bundle, as a proxy's might be
    certificate.write_bytes(Path(certifi.where()).read_bytes())
    mirror = simple_index(tmp_path / "mirror", "only_on_the_mirror")
    extra = simple_index(tmp_path / "extra", "only_on_the_extra_index")
    wheel(tmp_path / "wheels", "only_in_the_wheel_folder")
    not_these = [(tmp_path / name).as_uri() for name in ("not-this-index", "not-this-extra-index")]
    # pip install's own section over the global one; `wheel` is pip wheel's, listed after `global`.
    (tmp_path / "pip.conf").write_text(
        f"[global]\nindex-url = {not_these[0]}\nextra-index-url = {not_these[1]}\n"
        f"find-links = {tmp_path / 'wheels'}\ncert = {certificate}\n[install]\nindex-url = {mirror}\n"
        f"[wheel]\nfind-links = {tmp_path / 'not-pip-install'}\n"
    )  # fmt: skip
    # A user's pip set-up and nothing of this machine's: the variable overrides the file's extra index.
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PIP_", "UV_"))}
    env |= {"HOME": str(tmp_path), "PIP_CONFIG_FILE": str(tmp_path / "pip.conf"), "PIP_EXTRA_INDEX_URL": extra,
            "UV_CACHE_DIR": str(tmp_path / "uv-cache")}  # fmt: skip
    python, uv = pip_of(which, tmp_path), Path(sys.executable).parent / "uv"
    assert uv.exists(), f"{uv} is missing: `bash install.sh --dev` installs it"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    script = uv_options_from_pip() + (
        f'uv_options_from_pip {python}\nprintf "%s\\n" "${{uv_options[@]}}" "SSL_CERT_FILE=$SSL_CERT_FILE"\n'
        f'{uv} pip install --quiet "${{uv_options[@]}}" --python {tmp_path}/venv/bin/python '
        "only_on_the_mirror only_on_the_extra_index only_in_the_wheel_folder\n"
    )  # fmt: skip
    result = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    options = result.stdout.splitlines()
    assert options == ["--index-strategy", "unsafe-best-match", "--index-url", mirror, "--extra-index-url", extra,
                       "--find-links", str(tmp_path / "wheels"), f"SSL_CERT_FILE={certificate}"]  # fmt: skip
    imported = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-c",
         "import only_on_the_mirror as a, only_on_the_extra_index as b, only_in_the_wheel_folder as c; "
         "print(a.FROM, b.FROM, c.FROM)"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert imported.stdout.split() == ["only-on-the-mirror", "only-on-the-extra-index", "wheels"], imported.stderr

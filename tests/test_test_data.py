"""Where the tests find raw Multi30k (testing_utils.find_multi30k): ``$MULTI30K_DIR``, else the quick
start's download, else the release downloaded once into a cache (the download stubbed at the
URL-opening call); with none to be had, the run stops at the first test that needs it, with one
line."""
import gzip
import io
import os
import shutil
import subprocess
import sys
import urllib.error

import pytest

import prepare
from testing_utils import LANGS, REPO, NoMulti30k, find_multi30k

NAMES = ("train", "val", "test_2016_flickr")


@pytest.fixture
def release(monkeypatch):
    """The URLs the download asks for, each answered with a gzip file holding its own URL."""
    asked = []

    def urlopen(url, timeout):
        asked.append(url)
        return io.BytesIO(gzip.compress(f"{url}\n".encode()))
    monkeypatch.setattr(prepare.urllib.request, "urlopen", urlopen)
    return asked


def url(name, lang):
    return prepare.RELEASE_URL.format(name=name, lang=lang)


def raw_copy(where, langs=("en", "de")):
    where.mkdir(parents=True)
    for name in NAMES:
        for lang in langs:
            (where / f"{name}.{lang}").write_text("a dog .\n")
    return where


def test_multi30k_dir_is_read_as_it_is(release, tmp_path):
    raw_copy(tmp_path / "quickstart")
    found = find_multi30k({"MULTI30K_DIR": str(raw_copy(tmp_path / "copy"))}, tmp_path / "quickstart",
                          tmp_path / "cache")
    assert found == tmp_path / "copy" and release == [] and not (tmp_path / "cache").exists()


def test_a_multi30k_dir_that_lacks_a_file_is_named_in_one_line(release, tmp_path):
    copy = raw_copy(tmp_path / "copy")
    (copy / "val.de").unlink()
    with pytest.raises(NoMulti30k) as error:
        find_multi30k({"MULTI30K_DIR": str(copy)}, tmp_path / "quickstart", tmp_path / "cache", langs=LANGS)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"MULTI30K_DIR={copy} lacks train.fr, train.cs, val.de, ")
    assert release == []


def test_the_quick_starts_copy_is_read_and_completed_with_the_languages_it_lacks(release, tmp_path):
    quickstart = raw_copy(tmp_path / "runs" / "raw")
    assert find_multi30k({}, quickstart, tmp_path / "cache") == quickstart and release == []  # En-De alone
    assert find_multi30k({}, quickstart, tmp_path / "cache", langs=LANGS) == quickstart
    assert sorted(release) == sorted(url(name, lang) for name in NAMES for lang in ("fr", "cs"))
    assert (quickstart / "train.en").read_text() == "a dog .\n" and not (tmp_path / "cache").exists()


def test_without_either_the_release_is_downloaded_once_into_the_cache(release, tmp_path):
    cache = tmp_path / "cache" / "multi30k"
    assert find_multi30k({}, tmp_path / "no-quickstart", cache, langs=LANGS) == cache
    assert sorted(release) == sorted(url(name, lang) for name in NAMES for lang in LANGS)
    assert (cache / "val.cs").read_text() == url("val", "cs") + "\n"
    release.clear()
    assert find_multi30k({}, tmp_path / "no-quickstart", cache, langs=LANGS) == cache and release == []


def test_with_no_network_the_error_is_one_line_naming_multi30k_dir(monkeypatch, tmp_path):
    def refused(url, timeout):
        raise urllib.error.URLError("Connection refused")
    monkeypatch.setattr(prepare.urllib.request, "urlopen", refused)
    with pytest.raises(NoMulti30k) as error:
        find_multi30k({}, tmp_path / "no-quickstart", tmp_path / "cache")
    message = str(error.value)
    assert "\n" not in message and "set MULTI30K_DIR to a local copy" in message
    assert url("train", "en") in message and "Connection refused" in message


@pytest.mark.slow
@pytest.mark.e2e
def test_a_run_with_no_data_to_be_had_stops_at_the_first_test_that_needs_it_with_that_line(tmp_path):
    """pytest itself, on a copy of the test suite's set-up with no quick start's copy beside it, no
    $MULTI30K_DIR, an empty cache and every download refused (a proxy on a closed port)."""
    tests, examples = tmp_path / "tests", tmp_path / "examples" / "multi30k"
    tests.mkdir(), examples.mkdir(parents=True)
    for name in ("conftest.py", "testing_utils.py"):
        shutil.copy(REPO / "tests" / name, tests)
    shutil.copy(REPO / "examples" / "multi30k" / "prepare.py", examples)
    shutil.copy(REPO / "pyproject.toml", tmp_path)  # (pytest's pythonpath)
    (tests / "test_any.py").write_text("import pytest\n\n\n@pytest.mark.slow\ndef test_a(multi30k_dir):\n    pass\n\n\n"
                                       "def test_b():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("multi30k_dir", "no_proxy")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), https_proxy="http://127.0.0.1:9",
               HTTPS_PROXY="http://127.0.0.1:9")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", tests],
                          cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "Traceback" not in out and "PASSED" not in out and "1 error" in out
    stop = next(line for line in out.splitlines() if "Interrupted" in line)
    assert "set MULTI30K_DIR to a local copy of its raw text" in stop, out


@pytest.mark.slow
@pytest.mark.e2e
def test_a_fast_test_that_reads_multi30k_stops_the_collection_naming_it(tmp_path):
    """The fast tier runs offline: pytest itself, on a copy of the suite's set-up with a test that is
    not marked slow and asks for raw Multi30k."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "testing_utils.py"):
        shutil.copy(REPO / "tests" / name, tests)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    (tests / "test_any.py").write_text("def test_a(multi30k_dir):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", tests], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "the fast tier reads no Multi30k (mark these slow, or use dummy_bin): tests/test_any.py::test_a" in proc.stderr

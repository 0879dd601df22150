"""What the tests share besides fixtures (tests/conftest.py): the repository and where the tests
find raw Multi30k."""
import os
import sys
import tempfile
from pathlib import Path

from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "multi30k"))
import prepare  # noqa: E402  (the recipes' own download)

#: Where the quick start (examples/multi30k/quickstart.sh, its default --work-dir) downloads raw Multi30k.
QUICKSTART_RAW = REPO / "runs" / "multi30k" / "data" / "raw"
#: Where the tests download it when neither $MULTI30K_DIR nor the quick start's copy is there.
CACHE_RAW = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fairseq_widearch" / "multi30k"
#: The languages the tests read: En-De, and French and Czech for the one-to-many tests.
LANGS = ("en", "de", "fr", "cs")


class NoMulti30k(Exception):
    """Raw Multi30k is neither named, nor at hand, nor downloadable."""


def find_multi30k(environ=os.environ, quickstart=QUICKSTART_RAW, cache=CACHE_RAW):
    """The directory of raw Multi30k (``{train,val,test_2016_flickr}.{en,de,fr,cs}``) the tests read:
    ``$MULTI30K_DIR`` when set; else the quick start's download, completed with the languages it
    lacks; else the public release, downloaded once into ``cache`` (prepare.py's own download,
    which fetches only the files absent). Raises NoMulti30k, one line naming MULTI30K_DIR, where a
    download is needed and fails."""
    if environ.get("MULTI30K_DIR"):
        return Path(environ["MULTI30K_DIR"])
    raw = quickstart if quickstart.is_dir() else cache
    try:
        with FileLock(Path(tempfile.gettempdir()) / "fairseq_widearch_multi30k.lock"):  # one download at a time
            return prepare.download(raw, LANGS)
    except OSError as e:
        raise NoMulti30k(f"the tests need raw Multi30k: set MULTI30K_DIR to a local copy of its raw text, "
                         f"{{train,val,test_2016_flickr}}.{{{','.join(LANGS)}}} ({e})") from None

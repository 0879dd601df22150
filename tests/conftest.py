"""Shared fixtures: tiny real data (slices of Multi30k) and trained checkpoints; helpers are in
testing_utils.py."""
import shutil
from collections import Counter

import pytest

from testing_utils import LANGS, REPO, NoMulti30k, cli, dummy_translation_data, fairseq, find_multi30k, train


def pytest_addoption(parser):
    parser.addoption("--multi30k-data", default=str(REPO / "runs" / "multi30k" / "data"),
                     help="the CUDA tier's Multi30k as examples/multi30k/setup.sh prepares it (bin/, bpe/codes, "
                          "test.ref.de); default: the quick start's, %(default)s")


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (tests/cuda; skipped without one): pytest -m cuda")
    config.addinivalue_line("markers", "slow: trains, decodes or takes seconds; the fast tier is "
                                       "pytest -m 'not slow and not cuda'")
    config.addinivalue_line("markers", "docs: a documentation policy (page budgets, figures from their rows, the manual's "
                                       "commands and wording): pytest -m docs")
    config.addinivalue_line("markers", "e2e: its subject is a process (a recipe or the manual's block run as bash, "
                                       "torchrun, a kill, an exit status, fairseq without the plugin): pytest -m e2e")
    config.addinivalue_line("markers", "guards(fix, launcher): the fix's guard under that launcher, a row of the "
                                       "fixes' matrix run outside it (tests/fix_guards.py)")
    # pytest-xdist's, registered here too so that a run without xdist does not warn about it
    config.addinivalue_line("markers", "xdist_group(name): tests one xdist worker runs (--dist loadgroup)")
    config.addinivalue_line("markers", "tier_order(key): where the CUDA tier's test is collected (tests/cuda)")


#: The files whose tests take longest on 2 cores, longest first: under ``--dist loadfile
#: --no-loadscope-reorder`` (tests/run.sh) each worker takes the next file when it is nearly done, so
#: the long files start first and the short ones fill the end. The order changes nothing else.
LONGEST = ("test_latent_depth_head_to_head.py", "test_fairseq_fixes_launched.py", "test_flows.py",
           "test_claims_study.py", "test_deploy.py", "test_lost_worker.py", "test_latent_depth_regime.py",
           "test_gpu_check.py", "test_fairseq_fixes.py")


def pytest_terminal_summary(terminalreporter):
    """The manual's size, reported (each page's budget is tests/test_docs.py's)."""
    if not (REPO / "README.md").exists():  # (a copy of the suite's set-up elsewhere)
        return
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    words = sum(len(page.read_text().split()) for page in pages)
    terminalreporter.write_line(f"the manual: {words:,} words in {len(pages)} pages (README.md, docs/*.md)")


#: The fixtures that read real Multi30k (found or downloaded): the slow tier's alone.
MULTI30K = ("multi30k_dir", "multi30k_o2m_dir")


def pytest_collection_modifyitems(items):
    """The fast tier runs offline: a test that is not slow but reads real Multi30k is an error
    (its data: ``dummy_bin``). """
    offline = [item.nodeid for item in items if not item.get_closest_marker("slow")
               and set(MULTI30K) & set(getattr(item, "fixturenames", ()))]
    if offline:
        raise pytest.UsageError("the fast tier reads no Multi30k (mark these slow, or use dummy_bin): "
                                + ", ".join(offline))
    order(items)


def order(items):
    """The longest test files first, then the other files with processes (e2e), then those with more
    slow tests, so that under ``--dist loadfile`` (tests/run.sh) the long files start first and the
    fast ones fill the workers' last minutes; then the CUDA tier's tests in the order of their
    ``tier_order`` keys, in the places they hold among the collected tests (tests/cuda/test_cuda.py,
    ARCH_ORDER: the order its workers take them)."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    processes = {item.path for item in items if item.get_closest_marker("e2e")}
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(LONGEST)), item.path not in processes,
                                 -slow[item.path]))  # stable: a file's order kept
    slots = [i for i, item in enumerate(items) if item.get_closest_marker("tier_order")]
    ranked = sorted((items[i] for i in slots), key=lambda item: item.get_closest_marker("tier_order").args[0])
    for i, item in zip(slots, ranked):
        items[i] = item


def raw_multi30k(request, langs):
    """Raw Multi30k in ``langs`` (testing_utils.find_multi30k). Where none is to be had, the run stops
    at the first test that needs it, with one line naming MULTI30K_DIR."""
    try:
        return find_multi30k(langs=langs)
    except NoMulti30k as e:
        message = str(e)
    request.session.shouldstop = message
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def dummy_bin(tmp_path_factory):
    """Random en-de pairs, 37 per split, made in this process (testing_utils.dummy_translation_data):
    the fast tier's data, which needs neither Multi30k nor a network."""
    return dummy_translation_data(tmp_path_factory.mktemp("dummy"))


@pytest.fixture(scope="session")
def multi30k_dir(request):
    """Raw Multi30k, En-De."""
    return raw_multi30k(request, ("en", "de"))


@pytest.fixture(scope="session")
def multi30k_o2m_dir(request):
    """Raw Multi30k, En-De-Fr-Cs (the one-to-many tests')."""
    return raw_multi30k(request, LANGS)


def prepare(raw, work, *args):
    """examples/multi30k/prepare.py's main in this process (its fairseq-preprocess runs in processes
    of its own, as the recipe's): raw Multi30k tokenized, BPE'd and binarized into ``work``."""
    out = cli("prepare", "--data-dir", raw, "--work-dir", work, *args)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="session")
def multi30k_bin(tmp_path_factory, multi30k_dir):
    """First 1,000 Multi30k En-De training pairs, 1,000 BPE merges, binarized (joined dictionary)."""
    work = tmp_path_factory.mktemp("multi30k")
    prepare(multi30k_dir, work, "--max-train-lines", 1000, "--bpe-merges", 1000)
    return work / "bin"


@pytest.fixture(scope="session")
def multi30k_slice_bin(tmp_path_factory, multi30k_bin):
    """The first 100 sentence pairs of each split of ``multi30k_bin``, with its dictionaries, BPE codes
    and test reference (prepare.py's layout): for the tests of a trainer's or the study's mechanics
    (epochs, patience, resuming), where a full epoch, validation or test set only costs time."""
    work, full = tmp_path_factory.mktemp("multi30k_slice"), multi30k_bin.parent

    def head(src, dst):
        dst.write_text("".join(src.read_text().splitlines(keepends=True)[:100]))

    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            head(full / "bpe" / f"{split}.{lang}", work / f"{split}.{lang}")
    head(full / "test.ref.de", work / "test.ref.de")
    (work / "bpe").mkdir()
    shutil.copy(full / "bpe" / "codes", work / "bpe" / "codes")
    fairseq("preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", work / "train",
         "--validpref", work / "valid", "--testpref", work / "test", "--srcdict", multi30k_bin / "dict.en.txt",
         "--tgtdict", multi30k_bin / "dict.de.txt", "--destdir", work / "bin", "--workers", 1)
    return work / "bin"


@pytest.fixture(scope="session")
def multi30k_o2m_bin(tmp_path_factory, multi30k_o2m_dir):
    """One-to-many en-de, en-fr, en-cs: first 500 training lines, 1,000 BPE merges, one dictionary."""
    work = tmp_path_factory.mktemp("multi30k_o2m")
    prepare(multi30k_o2m_dir, work, "--tgt", "de,fr,cs", "--max-train-lines", 500, "--bpe-merges", 1000)
    return work / "bin"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, multi30k_bin):
    """``arch -> directory`` holding ``checkpoint_last.pt`` of 2 updates on ``multi30k_bin``,
    trained once per test run and shared by the tests that only need some trained model."""
    trained = {}

    def get(arch):
        if arch not in trained:
            trained[arch] = tmp_path_factory.mktemp(arch)
            train(multi30k_bin, trained[arch], arch, max_update=2)
        return trained[arch]

    return get

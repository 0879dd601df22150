"""fairseq-widearch: wide Transformer architectures as a fairseq plugin."""
from setuptools import find_packages, setup

# PyPI's fairseq 0.12.2 does not import on Python >= 3.11 (mutable dataclass defaults);
# ve-fairseq 0.12.3 is prebuilt cp311 and cp312 wheels of upstream fairseq's main branch after the
# 0.12.2 release (imports as `fairseq`; docs/fairseq_fixes.md says where it differs from 0.12.2).
# The package is tested on CPython 3.11 and 3.12 only.
FAIRSEQ = ["ve-fairseq==0.12.3"]

PLOTS = ["matplotlib"]  # the plot_* tools of fairseq_widearch.cli
EXAMPLES = ["sacremoses", "subword-nmt", "sacrebleu>=2.0"] + PLOTS
DEPLOY = ["ctranslate2>=4.0"]  # python -m fairseq_widearch.cli.export_ctranslate2
# The documentation site (mkdocs.yml): Markdown pages that read the same on GitHub, and the API
# rendered from the docstrings; Sphinx would need MyST to read them and autodoc for the API.
DOCS = ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"]

setup(
    name="fairseq-widearch",
    version="0.1.0",
    description="Wide-instead-of-deep Transformer architectures for fairseq NMT",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_widearch", "fairseq_widearch.*"]),
    python_requires=">=3.11, <3.13",  # ve-fairseq has wheels for CPython 3.11 and 3.12 only
    install_requires=["torch>=2.11"] + FAIRSEQ,  # the lowest torch the package has run with (GPU: 2.11, CPU: 2.13)
    extras_require={
        "examples": EXAMPLES,
        "plots": PLOTS,
        "deploy": DEPLOY,
        "docs": DOCS,
        "test": ["pytest>=7", "pytest-timeout", "pytest-xdist", "ruff==0.17.6"] + EXAMPLES + DEPLOY + DOCS,
    },
    license="MIT",
)
